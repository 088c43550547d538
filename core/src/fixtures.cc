#include "optiflow/core/fixtures.h"

#include <fmt/format.h>

namespace optiflow::core::fixtures {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// One channel's ring as seen from a rank: at(k) is the rank k places further along.
class RingView {
 public:
  RingView(const std::vector<int>* order, int n, int rank) : order_(order), n_(n), pos_(rank) {
    if (order_ != nullptr) {
      for (int i = 0; i < n; ++i) {
        if ((*order_)[i] == rank) pos_ = i;
      }
    }
  }
  int at(int offset) const {
    const int i = mod(pos_ + offset, n_);
    return order_ != nullptr ? (*order_)[i] : i;
  }

 private:
  const std::vector<int>* order_;
  int n_;
  int pos_;
};

RingView ringOf(const RingOptions& o, const RingOrders& orders, int rank, int channel) {
  const std::vector<int>* order = orders.empty() ? nullptr : &orders[channel % orders.size()];
  return RingView(order, o.nRanks, rank);
}

Schedule skeleton(const RingOptions& o, const RingOrders& orders, Collective coll, std::string_view name) {
  Schedule s = emptySchedule(coll, o.nRanks, o.nRanks * o.channels, o.inPlace);
  s.name = fmt::format("ring_{}_{}r_{}ch{}", name, o.nRanks, o.channels, o.inPlace ? "_inplace" : "");
  s.protocol = o.protocol;
  s.nChannels = o.channels;
  for (int r = 0; r < o.nRanks; ++r) {
    for (int c = 0; c < o.channels; ++c) {
      const bool ring = o.nRanks > 1;
      const RingView v = ringOf(o, orders, r, c);
      s.ranks[r].threadBlocks.push_back(makeBlock(c, ring ? v.at(1) : -1, ring ? v.at(-1) : -1, c));
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

Schedule ringAllGather(const RingOptions& o, const RingOrders& orders) {
  Schedule s = skeleton(o, orders, Collective::AllGather, "allgather");
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
      steps.reserve(static_cast<std::size_t>(n) + 1);  // exactly: NCCL's rings on 1024 ranks hold gigabytes of steps
      if (!o.inPlace) steps.push_back(makeStep(StepOp::Copy, I, c, O, own));
      if (n == 1) continue;
      const RingView ring = ringOf(o, orders, r, c);
      steps.push_back(makeStep(StepOp::Send, ownBuf, ownOff, O, own));
      for (int t = 1; t <= n - 2; ++t) {
        const int chunk = ring.at(-t) * ch + c;
        steps.push_back(makeStep(StepOp::RecvCopySend, O, chunk, O, chunk));
      }
      const int last = ring.at(1) * ch + c;
      steps.push_back(makeStep(StepOp::Recv, O, last, O, last));
    }
  }
  return s;
}

Schedule ringReduceScatter(const RingOptions& o, const RingOrders& orders) {
  Schedule s = skeleton(o, orders, Collective::ReduceScatter, "reducescatter");
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
        // In place the output already is the input.
        if (!o.inPlace) steps.push_back(makeStep(StepOp::Copy, I, c, O, c));
        continue;
      }
      const RingView ring = ringOf(o, orders, r, c);
      const int first = ring.at(-1) * ch + c;
      steps.reserve(static_cast<std::size_t>(n));
      steps.push_back(makeStep(StepOp::Send, I, first, I, first));
      for (int t = 0; t <= n - 3; ++t) {
        const int chunk = ring.at(-t - 2) * ch + c;
        steps.push_back(makeStep(StepOp::RecvReduceSend, I, chunk, I, chunk));
      }
      steps.push_back(makeStep(StepOp::RecvReduceCopy, I, r * ch + c, O, c));
    }
  }
  return s;
}

Schedule ringAllReduce(const RingOptions& o, const RingOrders& orders) {
  Schedule s = skeleton(o, orders, Collective::AllReduce, "allreduce");
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
      const RingView ring = ringOf(o, orders, r, c);
      const int first = ring.at(-1) * ch + c;
      steps.reserve(2 * static_cast<std::size_t>(n) - 1);
      steps.push_back(makeStep(StepOp::Send, I, first, I, first));
      for (int t = 0; t <= n - 3; ++t) {
        const int chunk = ring.at(-t - 2) * ch + c;
        steps.push_back(makeStep(StepOp::RecvReduceSend, I, chunk, I, chunk));
      }
      const int own = r * ch + c;
      steps.push_back(makeStep(StepOp::RecvReduceCopySend, I, own, O, own));
      for (int t = 0; t <= n - 3; ++t) {
        const int chunk = ring.at(-1 - t) * ch + c;
        steps.push_back(makeStep(StepOp::RecvCopySend, O, chunk, O, chunk));
      }
      const int last = ring.at(1) * ch + c;
      steps.push_back(makeStep(StepOp::Recv, O, last, O, last));
    }
  }
  return s;
}

}  // namespace optiflow::core::fixtures
