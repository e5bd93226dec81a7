// The timeline's recorder (io.trace): the window of steps, the file's JSON text
// (escaped names, integer nanoseconds as microseconds), written once per rank.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "comm/trace.hpp"

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

TEST(Trace, RecordsTheWindowAndWritesOnceWhenPastIt) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string path = "/tmp/ddp_test_trace_" + std::to_string(getpid()) + ".json";
  ddp::trace::open(MPI_COMM_WORLD, path, 2, 3, "rank " + std::to_string(rank) + " (\"quoted\" host)",
                   "\"world_size\": 1");
  ddp::trace::name_row(ddp::trace::kBucketRow + 1, "all-reduce bucket 1: a\\b");

  EXPECT_EQ(ddp::trace::begin_step(1), "");
  EXPECT_FALSE(ddp::trace::recording());
  { const ddp::trace::Span outside("before the window", "step"); }

  EXPECT_EQ(ddp::trace::begin_step(2), "");
  EXPECT_TRUE(ddp::trace::recording());
  {
    const ddp::trace::Span span("layers.0 conv2d(8, 3, pad=1)", "forward", "\"layer\": 0");
    EXPECT_TRUE(span.on());
  }
  ddp::trace::record("all-reduce b1", "comm", ddp::trace::kBucketRow + 1, 1005, 3010, "\"bytes\": 4");
  ddp::trace::record("line\nbreak", "comm", ddp::trace::kMainRow, 7, 7);
  EXPECT_EQ(ddp::trace::begin_step(3), "");
  EXPECT_TRUE(ddp::trace::recording());

  EXPECT_EQ(ddp::trace::begin_step(4), path);  // past the window: written
  EXPECT_FALSE(ddp::trace::recording());
  EXPECT_EQ(ddp::trace::begin_step(5), "");
  EXPECT_EQ(ddp::trace::close(), "");  // once

  const std::string text = read(path);
  std::remove(path.c_str());
  EXPECT_NE(text.find("\"args\": {\"name\": \"rank " + std::to_string(rank) + " (\\\"quoted\\\" host)\"}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("{\"name\": \"all-reduce bucket 1: a\\\\b\"}"), std::string::npos) << text;
  EXPECT_NE(text.find("\"name\": \"all-reduce b1\", \"cat\": \"comm\", \"ph\": \"X\", \"pid\": " +
                      std::to_string(rank) +
                      ", \"tid\": 101, \"ts\": 1.005, \"dur\": 2.005, \"args\": {\"bytes\": 4}"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\"name\": \"line\\nbreak\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"ts\": 0.007, \"dur\": 0.000"), std::string::npos) << text;
  EXPECT_NE(text.find("\"name\": \"layers.0 conv2d(8, 3, pad=1)\", \"cat\": \"forward\""), std::string::npos);
  EXPECT_NE(text.find("\"args\": {\"layer\": 0}"), std::string::npos);
  EXPECT_EQ(text.find("before the window"), std::string::npos);
  EXPECT_NE(text.find("\"otherData\": {\"rank\": " + std::to_string(rank) + ", \"steps\": [2, 3]"),
            std::string::npos);
  EXPECT_NE(text.find("\"world_size\": 1}}"), std::string::npos);
}

// A window the run never reaches writes nothing.
TEST(Trace, NothingRecordedNothingWritten) {
  const std::string path = "/tmp/ddp_test_trace_empty_" + std::to_string(getpid()) + ".json";
  ddp::trace::open(MPI_COMM_WORLD, path, 100, 200, "rank", "");
  EXPECT_EQ(ddp::trace::begin_step(1), "");
  EXPECT_EQ(ddp::trace::close(), "");
  EXPECT_FALSE(std::ifstream(path).good());
}

}  // namespace
