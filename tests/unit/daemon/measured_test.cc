// optiflowd's view of the profiler's measurements: joined with the plan each communicator pinned, exported under
// OptiFlow's and NVIDIA Inspector's metric names. A real segment, written the way the plugins write it.
#include "optiflow/daemon/measured.h"

#include <unistd.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "optiflow/schedcache/writer.h"

namespace optiflow::daemon {
namespace {

namespace sc = schedcache;

class Measured : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = "measured-" + std::to_string(::getpid());
    sc::Writer::remove(ns_, &error_);
    sc::WriterOptions o;
    o.ns = ns_;
    o.build = "measured-test";
    writer_ = sc::Writer::open(o, &error_);
    ASSERT_NE(writer_, nullptr) << error_.message;
    reader_ = sc::Reader::attach(ns_, &error_);
    ASSERT_NE(reader_, nullptr) << error_.message;
  }
  void TearDown() override {
    reader_.reset();
    writer_.reset();
    sc::Writer::remove(ns_, &error_);
  }
  std::string ns_;
  sc::Error error_;
  std::unique_ptr<sc::Writer> writer_;
  std::unique_ptr<sc::Reader> reader_;
};

TEST_F(Measured, JoinedWithThePinnedPlanAndExportedUnderBothNames) {
  sc::Plan plan;
  plan.source = "measured_test";
  sc::PlanItem it;
  it.coll = core::Collective::AllReduce;
  it.nRanks = 8;
  it.nNodes = 1;
  it.minBytes = 0;
  it.maxBytes = 1 << 24;
  it.algorithm = core::Algorithm::Ring;
  it.protocol = core::Protocol::Simple;
  it.nChannels = 8;
  it.nativeUs = 40.0f;
  plan.items.push_back(it);
  const auto published = writer_->publish(plan, &error_);
  ASSERT_TRUE(published) << error_.message;
  sc::Status st = sc::Status::kOk;
  ASSERT_EQ(reader_->pinComm(0x77, published->hash, 8, 1, &st), published->hash);
  const auto coll = static_cast<std::uint8_t>(core::Collective::AllReduce);
  // The plan's decision, measured at 50 us (prediction 40 us: ratio 1.25), and NCCL's own Tree/LL at 20 us.
  sc::MeasureRecord* ring = reader_->measureRecord(0x77, coll, 1 << 20, 1, 2, 8);
  sc::MeasureRecord* tree = reader_->measureRecord(0x77, coll, 1 << 20, 0, 0, 4);
  ASSERT_NE(ring, nullptr);
  ASSERT_NE(tree, nullptr);
  for (int i = 0; i < 5; ++i) sc::Reader::addMeasurement(ring, 50'000, 1);
  for (int i = 0; i < 3; ++i) sc::Reader::addMeasurement(tree, 20'000, 1);

  const std::vector<MeasuredRow> rows = joinMeasurements(*reader_);
  ASSERT_EQ(rows.size(), 2u);
  for (const MeasuredRow& r : rows) {
    EXPECT_EQ(r.nRanks, 8u);
    EXPECT_EQ(r.nNodes, 1u);
    if (r.m.algorithm == core::Algorithm::Ring) {
      ASSERT_TRUE(r.predictedUs.has_value());
      EXPECT_DOUBLE_EQ(*r.predictedUs, 40.0);
    } else {
      EXPECT_FALSE(r.predictedUs.has_value()) << "NCCL's own configuration is not the entry's decision";
    }
  }
  Metrics metrics;
  describeMeasurementMetrics(metrics);
  exportMeasurements(metrics, rows);
  const std::string ringLabels = promLabels({{"collective", "allreduce"},
                                             {"size", "1048576"},
                                             {"algorithm", "Ring"},
                                             {"protocol", "Simple"},
                                             {"channels", "8"}});
  EXPECT_NEAR(metrics.get("optiflowd_measured_time_us", ringLabels), 50.0, 50.0 * 0.032);
  EXPECT_NEAR(metrics.get("optiflowd_prediction_error_ratio", ringLabels), 1.25, 1.25 * 0.032);
  const std::string inspector = promLabels({{"comm_name", "0000000000000077"},
                                            {"n_nodes", "1"},
                                            {"nranks", "8"},
                                            {"collective", "allreduce"},
                                            {"message_size", "1-2MB"},
                                            {"algo_proto", "Tree_LL"}});
  EXPECT_NEAR(metrics.get("nccl_collective_exec_time_microseconds", inspector), 20.0, 20.0 * 0.032);
  // 1 MiB in 20 us = 52.4 GB/s algbw, x 2(n-1)/n = 1.75 for AllReduce on 8 ranks.
  EXPECT_NEAR(metrics.get("nccl_bus_bandwidth_gbs", inspector), 1048576.0 / 20e-6 / 1e9 * 1.75, 3.0);
  const std::string text = metrics.renderPrometheus();
  EXPECT_NE(text.find("# TYPE nccl_bus_bandwidth_gbs gauge"), std::string::npos) << text;
}

TEST(MeasuredHelpers, BusBandwidthFactorsAndSizeBuckets) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(core::Collective::AllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(core::Collective::AllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(core::Collective::Broadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(core::Collective::AllReduce, 1), 1.0);
  EXPECT_EQ(messageSizeBucket(512), "512-513B");
  EXPECT_EQ(messageSizeBucket(4'500'000'000ULL), "4-5GB");
  EXPECT_EQ(messageSizeBucket(1 << 20), "1-2MB");
}

TEST_F(Measured, WhatThePluginsCouldNotRecordIsExportedByReason) {
  Metrics metrics;
  describeMeasurementMetrics(metrics);
  exportMeasureCounters(metrics, reader_->measureCounters());
  EXPECT_EQ(metrics.get("optiflowd_measurements_dropped_total", promLabels({{"reason", "choice_full"}})), 0.0);
  // Two communicators finalize, as the plugins add their counts then.
  reader_->addMeasureCounters({.untimed = 3, .poolFull = 0, .tableFull = 2, .foreign = 1, .choiceFull = 5});
  reader_->addMeasureCounters({.untimed = 1, .poolFull = 4, .tableFull = 0, .foreign = 0, .choiceFull = 2});
  exportMeasureCounters(metrics, reader_->measureCounters());
  EXPECT_EQ(metrics.get("optiflowd_measurements_dropped_total", promLabels({{"reason", "untimed"}})), 4.0);
  EXPECT_EQ(metrics.get("optiflowd_measurements_dropped_total", promLabels({{"reason", "pool_full"}})), 4.0);
  EXPECT_EQ(metrics.get("optiflowd_measurements_dropped_total", promLabels({{"reason", "table_full"}})), 2.0);
  EXPECT_EQ(metrics.get("optiflowd_measurements_dropped_total", promLabels({{"reason", "foreign"}})), 1.0);
  EXPECT_EQ(metrics.get("optiflowd_measurements_dropped_total", promLabels({{"reason", "choice_full"}})), 7.0);
  const std::string text = metrics.renderPrometheus();
  EXPECT_NE(text.find("# TYPE optiflowd_measurements_dropped_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("optiflowd_measurements_dropped_total{reason=\"choice_full\"} 7"), std::string::npos) << text;
}

}  // namespace
}  // namespace optiflow::daemon
