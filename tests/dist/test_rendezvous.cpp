// The torchrun bootstrap (dist/rendezvous.h): rank 0 hands the NCCL id to the other ranks over
// TCP; here the ranks are threads of one process on 127.0.0.1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/dist/rendezvous.h"
#include "testing/tensor_testing.h"

namespace {

using forge::dist::rendezvous_exchange;
using forge::testing::error_of;

// A port per test process and test, away from the usual ones.
int test_port(int k) { return 30000 + static_cast<int>(::getpid() % 5000) * 5 + k; }

TEST(Rendezvous, EveryRankGetsRankZerosPayload) {
  const int port = test_port(0);
  const std::string id(256, 'a');
  std::vector<std::future<std::string>> ranks;
  // The clients start first: they must retry until rank 0 listens.
  for (int r = 1; r < 4; ++r)
    ranks.push_back(std::async(std::launch::async, [=] { return rendezvous_exchange("127.0.0.1", port, r, 4, "", 10); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto zero = std::async(std::launch::async, [&] { return rendezvous_exchange("localhost", port, 0, 4, id, 10); });
  EXPECT_EQ(zero.get(), id);
  for (auto& f : ranks) EXPECT_EQ(f.get(), id);
}

TEST(Rendezvous, AWorldOfOneNeedsNoNetwork) { EXPECT_EQ(rendezvous_exchange("nowhere.invalid", 1, 0, 1, "x"), "x"); }

TEST(Rendezvous, AMissingRankZeroIsAnErrorAfterTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.1", test_port(1), 1, 2, "", 0.5); });
  EXPECT_NE(e.find("could not reach rank 0 within 0.5 s"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(Rendezvous, MissingRanksAreAnErrorOnRankZero) {
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.1", test_port(2), 0, 3, "id", 0.5); });
  EXPECT_NE(e.find("only 0 of the 2 other ranks connected within 0.5 s"), std::string::npos) << e;
}

TEST(Rendezvous, BadArgumentsAreRefusedBeforeAnyNetworking) {
  EXPECT_NE(error_of([] { rendezvous_exchange("127.0.0.1", 0, 0, 2, "id"); }).find("not a TCP port"), std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_exchange("127.0.0.1", 29501, 2, 2, "id"); }).find("outside a world of 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_exchange("no-such-host.invalid", 29501, 1, 2, "", 1); }).find("cannot resolve"),
            std::string::npos);
}

}  // namespace
