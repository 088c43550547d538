// optiflow-bench: times schedules (and NCCL's own collectives) in nccl-tests' layout. One process per GPU started
// by the site's launcher (mpirun, srun, torchrun), or one process with a thread per rank (--backend cpu). Exit
// status: 0 every item ran (and passed --check), 1 some item failed, 2 the arguments, the environment or the
// rendezvous were wrong.
#include <fstream>
#include <iostream>
#include <memory>

#include "backends.h"
#include "optiflow/exec/bench.h"
#include "optiflow/exec/rendezvous.h"

#ifndef OPTIFLOW_BENCH_HAVE_CUDA
#define OPTIFLOW_BENCH_HAVE_CUDA 0
#endif

int main(int argc, char** argv) {
  using namespace optiflow;
  auto parsed = exec::parseBenchArgs(argc, argv, OPTIFLOW_BENCH_HAVE_CUDA != 0);
  if (!parsed) {
    std::cerr << "optiflow-bench: " << parsed.error().message << "\n";
    return 2;
  }
  if (parsed->help) {
    std::cout << parsed->helpText;
    return 0;
  }
  const exec::BenchOptions& o = parsed->options;
  auto launch = exec::launchInfoFromEnv();
  if (!launch) {
    std::cerr << "optiflow-bench: " << launch.error().str() << "\n";
    return 2;
  }
  if (!o.rendezvous.empty()) {
    if (auto hp = exec::parseHostPort(o.rendezvous); !hp) {
      std::cerr << "optiflow-bench: " << hp.error().str() << "\n";
      return 2;
    }
  }
  auto items = exec::loadBenchItems(o.schedules);
  if (!items) {
    std::cerr << "optiflow-bench: " << items.error().str() << "\n";
    return 2;
  }
  std::unique_ptr<exec::BenchBackend> backend;
  if (o.backend == "cpu") {
    if (launch->size > 1) {
      std::cerr << "optiflow-bench: --backend cpu runs every rank as a thread of one process, but the launcher "
                   "started "
                << launch->size << " processes (" << launch->source << "); start one\n";
      return 2;
    }
    backend = exec::makeCpuBenchBackend();
  } else {
#if OPTIFLOW_BENCH_HAVE_CUDA
    auto cuda = exec::makeCudaBackend(o, *launch);
    if (!cuda) {
      std::cerr << "optiflow-bench: rank " << launch->rank << ": " << cuda.error().str() << "\n";
      return 2;
    }
    backend = std::move(cuda).value();
#else
    std::cerr << "optiflow-bench: built without CUDA and NCCL\n";  // parseBenchArgs refuses --backend cuda first
    return 2;
#endif
  }
  std::vector<exec::ItemResult> results;
  const bool ok = exec::runBench(o, *items, *backend, results);
  for (const exec::ItemResult& r : results) {
    if (!r.ok && backend->rank() == 0) std::cerr << "optiflow-bench: " << r.id << ": " << r.error << "\n";
  }
  if (backend->rank() == 0) {
    std::ofstream file;
    if (!o.output.empty()) {
      file.open(o.output, std::ios::binary | std::ios::trunc);
      if (!file) {
        std::cerr << "optiflow-bench: cannot write " << o.output << "\n";
        return 2;
      }
    }
    std::ostream& out = o.output.empty() ? std::cout : file;
    if (o.json) {
      out << exec::resultsJson(o, results, backend->name());
    } else {
      exec::writeText(out, o, results, *backend);
    }
    out.flush();
    if (!out) {
      std::cerr << "optiflow-bench: writing the results failed\n";
      return 2;
    }
  }
  bool wrong = false;
  for (const exec::ItemResult& r : results) {
    for (const exec::SizeRow& row : r.rows) wrong = wrong || row.outOfPlace.wrong > 0 || row.inPlace.wrong > 0;
  }
  return ok && !wrong ? 0 : 1;
}
