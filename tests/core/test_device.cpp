// Device selection: parse_device ("cpu", "cuda", "cuda:N", "auto") and its errors.
#include <gtest/gtest.h>

#include <string>

#include "forge/core/device.h"
#include "forge/core/error.h"
#include "forge/ops/creation.h"

namespace forge {
namespace {

std::string error_of(const std::string& spec, int gpus) {
  try {
    (void)parse_device(spec, gpus);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParseDevice, NamesAndAuto) {
  EXPECT_EQ(parse_device("cpu", 0), Device::cpu());
  EXPECT_EQ(parse_device("cpu", 2), Device::cpu());
  EXPECT_EQ(parse_device("cuda", 1), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:0", 1), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:7", 8), Device::cuda(7));
  EXPECT_EQ(parse_device("auto", 0), Device::cpu());
  EXPECT_EQ(parse_device("auto", 4), Device::cuda(0));
}

TEST(ParseDevice, UnknownSpellingsAreRefused) {
  for (const char* bad : {"gpu0", "", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:1 ", "cpu:0",
                          "cuda:12345"}) {
    const std::string msg = error_of(bad, 8);
    EXPECT_NE(msg.find("unknown device '" + std::string(bad) + "'; expected cpu, cuda, cuda:N or auto"),
              std::string::npos)
        << "'" << bad << "': " << msg;
  }
}

TEST(ParseDevice, MissingGpusAreClearErrors) {
  EXPECT_NE(error_of("cuda:3", 1).find("cuda:3 requested but 1 CUDA device is visible"), std::string::npos)
      << error_of("cuda:3", 1);
  EXPECT_NE(error_of("cuda:2", 2).find("cuda:2 requested but 2 CUDA devices are visible; use cuda:0 .. cuda:1"),
            std::string::npos)
      << error_of("cuda:2", 2);
  EXPECT_NE(error_of("cuda", 0).find("cuda requested but no CUDA device is visible"), std::string::npos)
      << error_of("cuda", 0);
}

TEST(ParseDevice, AgainstThisProcess) {
  const int gpus = cuda_device_count();
  EXPECT_EQ(parse_device("auto"), gpus > 0 ? Device::cuda(0) : Device::cpu());
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_THROW(parse_device("cuda:" + std::to_string(gpus)), Error);
  // Device::parse checks the spelling only.
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_THROW(Device::parse("cuda:+1"), Error);
}

}  // namespace
}  // namespace forge
