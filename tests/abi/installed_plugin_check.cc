// installed_plugin_check: resolves NCCL_TUNER_PLUGIN (or NCCL_NET_PLUGIN with --kind net) exactly as NCCL 2.28
// does (src/plugin/plugin_open.cc) against the system library path, with no help from the build tree, and prints
// the library it found. scripts/package-test.sh runs it after installing the .deb, without LD_LIBRARY_PATH, to show
// that `NCCL_TUNER_PLUGIN=optiflow` reaches the packaged libnccl-tuner-optiflow.so.
//
//   installed_plugin_check [--kind tuner|net] [--expect-dir DIR]
//
// NCCL's resolution of a value V (neither empty nor "none"): dlopen(V, RTLD_NOW|RTLD_LOCAL); when that fails and
// V has no '/' and is not lib*.so, dlopen("libnccl-<kind>-V.so"). For V = "optiflow" the first dlopen must fail
// (there is no file called "optiflow" on the library path) and the second must find our library. Exit 0 when the
// library loads, exports the versioned table (ncclTunerPlugin_v5 / ncclNetPlugin_v9), the table's name is
// "OptiFlow" and, with --expect-dir, the library lies in DIR; 1 otherwise, with the reason on stderr.
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace {

constexpr int kNcclDlopenFlags = RTLD_NOW | RTLD_LOCAL;

int fail(const std::string& msg) {
  std::fprintf(stderr, "installed_plugin_check: FAIL: %s\n", msg.c_str());
  return 1;
}

std::string lastDlerror() {
  const char* e = dlerror();
  return e != nullptr ? e : "(no dlerror)";
}

int usage() {
  std::fprintf(stderr, "usage: installed_plugin_check [--kind tuner|net] [--expect-dir DIR]\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keeps stdout and the FAIL line on stderr in order
  std::string kind = "tuner";
  std::string expectDir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kind" && i + 1 < argc) {
      kind = argv[++i];
    } else if (a == "--expect-dir" && i + 1 < argc) {
      expectDir = argv[++i];
    } else {
      return usage();
    }
  }
  if (kind != "tuner" && kind != "net") return usage();

  const std::string envName = kind == "tuner" ? "NCCL_TUNER_PLUGIN" : "NCCL_NET_PLUGIN";
  const std::string symbol = kind == "tuner" ? "ncclTunerPlugin_v5" : "ncclNetPlugin_v9";
  const char* envValue = std::getenv(envName.c_str());
  const std::string value = envValue != nullptr && *envValue != '\0' ? envValue : "optiflow";
  const char* ldPath = std::getenv("LD_LIBRARY_PATH");
  std::printf("%s=%s (LD_LIBRARY_PATH %s)\n", envName.c_str(), value.c_str(), ldPath != nullptr ? ldPath : "unset");

  // Step 1: the value itself, as NCCL tries it first.
  void* handle = dlopen(value.c_str(), kNcclDlopenFlags);
  if (handle != nullptr) {
    return fail("dlopen(\"" + value + "\") succeeded: something on the library path is called \"" + value +
                "\"; NCCL would load that, not the OptiFlow plugin");
  }
  std::printf("dlopen(\"%s\") failed as NCCL expects: %s\n", value.c_str(), lastDlerror().c_str());

  // Step 2: libnccl-<kind>-<value>.so, only for a bare name.
  const bool hasSlash = value.find('/') != std::string::npos;
  const bool isLibSo = value.size() >= 6 && value.rfind("lib", 0) == 0 && value.ends_with(".so");
  if (hasSlash || isLibSo) return fail("NCCL would not try libnccl-" + kind + "-" + value + ".so for this value");
  const std::string libName = "libnccl-" + kind + "-" + value + ".so";
  handle = dlopen(libName.c_str(), kNcclDlopenFlags);
  if (handle == nullptr) return fail("dlopen(\"" + libName + "\"): " + lastDlerror());

  struct link_map* map = nullptr;
  std::string loaded;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) loaded = map->l_name;
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(loaded, ec);
  std::printf("dlopen(\"%s\") loaded %s", libName.c_str(), loaded.c_str());
  if (!ec && canonical.string() != loaded) std::printf(" -> %s", canonical.c_str());
  std::printf("\n");

  dlerror();
  void* table = dlsym(handle, symbol.c_str());
  if (table == nullptr) return fail(symbol + " not found in " + loaded + ": " + lastDlerror());
  Dl_info info{};
  if (dladdr(table, &info) == 0 || info.dli_fname == nullptr) return fail("dladdr(" + symbol + ") failed");
  // Both tables (ncclTuner_v5_t, ncclNet_v9_t) start with `const char* name`.
  const char* name = *static_cast<const char* const*>(table);
  std::printf("%s found in %s, name \"%s\"\n", symbol.c_str(), info.dli_fname, name != nullptr ? name : "(null)");
  if (std::strcmp(info.dli_fname, loaded.c_str()) != 0) {
    return fail(symbol + " resolved in " + info.dli_fname + ", not in " + loaded);
  }
  if (name == nullptr || std::strcmp(name, "OptiFlow") != 0) return fail("the table's name is not \"OptiFlow\"");

  if (!expectDir.empty()) {
    const std::filesystem::path want = std::filesystem::weakly_canonical(expectDir, ec);
    const std::filesystem::path got = (ec ? std::filesystem::path(loaded) : canonical).parent_path();
    if (std::filesystem::path(loaded).parent_path() != want && got != want) {
      return fail(loaded + " is not in " + expectDir);
    }
  }
  std::printf("OK: NCCL would load %s\n", loaded.c_str());
  return 0;
}
