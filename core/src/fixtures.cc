#include "optiflow/core/fixtures.h"

#include <fmt/format.h>

namespace optiflow::core::fixtures {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

Schedule skeleton(const RingOptions& o, Collective c, std::string_view name) {
  Schedule s = emptySchedule(c, o.nRanks, o.nRanks * o.channels, o.inPlace);
  s.name = fmt::format("ring_{}_{}r_{}ch{}", name, o.nRanks, o.channels, o.inPlace ? "_inplace" : "");
  s.protocol = o.protocol;
  s.nChannels = o.channels;
  for (int r = 0; r < o.nRanks; ++r) {
    for (int c2 = 0; c2 < o.channels; ++c2) {
      const bool ring = o.nRanks > 1;
      s.ranks[r].threadBlocks.push_back(
          makeBlock(c2, ring ? mod(r + 1, o.nRanks) : -1, ring ? mod(r - 1, o.nRanks) : -1, c2));
    }
  }
  return s;
}

}  // namespace

Step makeStep(StepOp op, BufferKind srcBuf, int srcOff, BufferKind dstBuf, int dstOff, int count) {
  Step st;
  st.op = op;
  st.srcBuf = srcBuf;
  st.srcOff = srcOff;
  st.dstBuf = dstBuf;
  st.dstOff = dstOff;
  st.count = count;
  return st;
}

ThreadBlock makeBlock(int id, int sendPeer, int recvPeer, int channel, std::vector<Step> steps) {
  ThreadBlock tb;
  tb.id = id;
  tb.sendPeer = sendPeer;
  tb.recvPeer = recvPeer;
  tb.channel = channel;
  tb.steps = std::move(steps);
  return tb;
}

Schedule emptySchedule(Collective c, int nRanks, int chunksPerLoop, bool inPlace) {
  Schedule s;
  s.name = "hand";
  s.collective = c;
  s.nRanks = nRanks;
  s.chunksPerLoop = chunksPerLoop;
  s.inPlace = inPlace;
  s.outOfPlace = !inPlace;
  s.ranks.resize(nRanks);
  for (int r = 0; r < nRanks; ++r) s.ranks[r].rank = r;
  return s;
}

Schedule ringAllGather(const RingOptions& o) {
  Schedule s = skeleton(o, Collective::AllGather, "allgather");
  const int n = o.nRanks;
  const int ch = o.channels;
  constexpr auto I = BufferKind::Input;
  constexpr auto O = BufferKind::Output;
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = ch;
    rp.outputChunks = n * ch;
    for (int c = 0; c < ch; ++c) {
      auto& steps = rp.threadBlocks[c].steps;
      const int own = r * ch + c;
      // In place the input already is the rank's slice of the output.
      const BufferKind ownBuf = o.inPlace ? O : I;
      const int ownOff = o.inPlace ? own : c;
      if (!o.inPlace) steps.push_back(makeStep(StepOp::Copy, I, c, O, own));
      if (n == 1) continue;
      steps.push_back(makeStep(StepOp::Send, ownBuf, ownOff, O, own));
      for (int t = 1; t <= n - 2; ++t) {
        const int chunk = mod(r - t, n) * ch + c;
        steps.push_back(makeStep(StepOp::RecvCopySend, O, chunk, O, chunk));
      }
      const int last = mod(r + 1, n) * ch + c;
      steps.push_back(makeStep(StepOp::Recv, O, last, O, last));
    }
  }
  return s;
}

Schedule ringReduceScatter(const RingOptions& o) {
  Schedule s = skeleton(o, Collective::ReduceScatter, "reducescatter");
  const int n = o.nRanks;
  const int ch = o.channels;
  constexpr auto I = BufferKind::Input;
  constexpr auto O = BufferKind::Output;
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = n * ch;
    rp.outputChunks = ch;
    for (int c = 0; c < ch; ++c) {
      auto& steps = rp.threadBlocks[c].steps;
      if (n == 1) {
        steps.push_back(makeStep(StepOp::Copy, I, c, O, c));
        continue;
      }
      const int first = mod(r - 1, n) * ch + c;
      steps.push_back(makeStep(StepOp::Send, I, first, I, first));
      for (int t = 0; t <= n - 3; ++t) {
        const int chunk = mod(r - t - 2, n) * ch + c;
        steps.push_back(makeStep(StepOp::RecvReduceSend, I, chunk, I, chunk));
      }
      steps.push_back(makeStep(StepOp::RecvReduceCopy, I, r * ch + c, O, c));
    }
  }
  return s;
}

Schedule ringAllReduce(const RingOptions& o) {
  Schedule s = skeleton(o, Collective::AllReduce, "allreduce");
  const int n = o.nRanks;
  const int ch = o.channels;
  constexpr auto I = BufferKind::Input;
  constexpr auto O = BufferKind::Output;
  for (int r = 0; r < n; ++r) {
    auto& rp = s.ranks[r];
    rp.inputChunks = n * ch;
    rp.outputChunks = o.inPlace ? 0 : n * ch;
    for (int c = 0; c < ch; ++c) {
      auto& steps = rp.threadBlocks[c].steps;
      if (n == 1) {
        if (!o.inPlace) steps.push_back(makeStep(StepOp::Copy, I, c, O, c));
        continue;
      }
      const int first = mod(r - 1, n) * ch + c;
      steps.push_back(makeStep(StepOp::Send, I, first, I, first));
      for (int t = 0; t <= n - 3; ++t) {
        const int chunk = mod(r - t - 2, n) * ch + c;
        steps.push_back(makeStep(StepOp::RecvReduceSend, I, chunk, I, chunk));
      }
      const int own = r * ch + c;
      steps.push_back(makeStep(StepOp::RecvReduceCopySend, I, own, O, own));
      for (int t = 0; t <= n - 3; ++t) {
        const int chunk = mod(r - 1 - t, n) * ch + c;
        steps.push_back(makeStep(StepOp::RecvCopySend, O, chunk, O, chunk));
      }
      const int last = mod(r + 1, n) * ch + c;
      steps.push_back(makeStep(StepOp::Recv, O, last, O, last));
    }
  }
  return s;
}

}  // namespace optiflow::core::fixtures
