// TensorBoard event files without TensorBoard: CRC-32C and its mask against known
// vectors, TFRecord framing byte for byte (the vector from the tensorboard package's
// RecordWriter), and a write failure that is one warning and no more writing.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "../temp_dir.hpp"
#include "io/tensorboard_writer.hpp"
#include "io/tfrecord.hpp"

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

}  // namespace

TEST(TfRecord, Crc32cOfTheCheckString) {
  const std::string s = "123456789";
  EXPECT_EQ(ddp::crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(ddp::crc32c("", 0), 0u);
}

TEST(TfRecord, MaskedCrc32c) {
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8 (mod 2^32), as TensorFlow's
  // crc32c::Mask and tensorboard's masked_crc32c(b"123456789").
  const std::string s = "123456789";
  EXPECT_EQ(ddp::masked_crc32c(s.data(), s.size()), 0xC78AB0E5u);
}

TEST(TfRecord, FramingMatchesTensorBoardsRecordWriter) {
  // tensorboard.summary.writer.record_writer.RecordWriter(f).write(b"hello")
  EXPECT_EQ(hex(ddp::tfrecord("hello")), "0500000000000000eab2043e68656c6c6fbb1f1c19");
}

TEST(TensorBoardWriter, WritesFramedRecordsUnderRunDirTb) {
  if (!ddp::kTensorBoardBuilt) GTEST_SKIP() << "built without protobuf";
  const ddp::test::TempDir tmp("/tmp/ddp_tb_test");
  const std::string& dir = tmp.path();
  std::string path;
  {
    ddp::TensorBoardWriter tb(dir, true);
    ASSERT_TRUE(tb.active());
    path = tb.path();
    EXPECT_EQ(path.rfind(dir + "/tb/events.out.tfevents.", 0), 0u) << path;
    tb.scalar("train/loss", 7, 0.25);
  }  // flushed at destruction
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Walk the records: three (the version event, the session's start, the scalar),
  // each with valid CRCs.
  std::size_t at = 0, records = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[at + i]);
    const std::string framed = ddp::tfrecord(bytes.substr(at + 12, n));
    ASSERT_EQ(framed, bytes.substr(at, framed.size())) << "record " << records;
    at += framed.size();
    ++records;
  }
  EXPECT_EQ(records, 3u);
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  std::remove(path.c_str());
}

TEST(TensorBoardWriter, AWriteFailureStopsWritingWithoutThrowing) {
  if (!ddp::kTensorBoardBuilt) GTEST_SKIP() << "built without protobuf";
  const ddp::test::TempDir tmp("/tmp/ddp_tb_test");
  const std::string& dir = tmp.path();
  // A file size limit makes write() fail with EFBIG, as a full disk makes it fail.
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  ddp::TensorBoardWriter tb(dir, true);
  ASSERT_TRUE(tb.active());
  for (int i = 0; i < 1000 && tb.active(); ++i) {
    tb.scalar("train/loss", i, 1.0 / (i + 1));
    if (i % 10 == 9) tb.flush();
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_FALSE(tb.active());
  tb.scalar("train/loss", 1000, 0.5);  // ignored, no second warning
  tb.flush();
}

TEST(TensorBoardWriter, AnUncreatableDirectoryIsAWarning) {
  if (!ddp::kTensorBoardBuilt) GTEST_SKIP() << "built without protobuf";
  const ddp::test::TempDir tmp("/tmp/ddp_tb_test");
  const std::string& dir = tmp.path();
  std::FILE* f = std::fopen((dir + "/tb").c_str(), "w");  // a file where the directory goes
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  ddp::TensorBoardWriter tb(dir, true);
  EXPECT_FALSE(tb.active());
}

TEST(TensorBoardWriter, DisabledWritesNothing) {
  const ddp::test::TempDir tmp("/tmp/ddp_tb_test");
  const std::string& dir = tmp.path();
  ddp::TensorBoardWriter tb(dir, false);
  EXPECT_FALSE(tb.active());
  tb.scalar("x", 1, 1.0);
  tb.flush();
  std::ifstream probe(dir + "/tb");
  EXPECT_FALSE(probe.good());
}
