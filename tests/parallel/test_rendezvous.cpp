// The torchrun bootstrap (parallel/rendezvous.h): rank 0 hands the NCCL id to the other ranks over
// TCP; here the ranks are threads of one process on 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "forge/core/error.h"
#include "forge/parallel/rendezvous.h"
#include "testing/tensor_testing.h"

namespace {

using forge::parallel::rendezvous_exchange;
using forge::testing::error_of;

const std::string kToken = "job-secret-0123";

// A port per test process and test, away from the usual ones.
int test_port(int k) { return 20000 + static_cast<int>(::getpid() % 4000) * 10 + k; }  // k < 10

TEST(Rendezvous, EveryRankGetsRankZerosPayload) {
  const int port = test_port(0);
  const std::string id(256, 'a');
  std::vector<std::future<std::string>> ranks;
  // The clients start first: they must retry until rank 0 listens.
  for (int r = 1; r < 4; ++r)
    ranks.push_back(std::async(std::launch::async, [=] { return rendezvous_exchange("127.0.0.1", port, r, 4, "", kToken, 10); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto zero = std::async(std::launch::async, [&] { return rendezvous_exchange("localhost", port, 0, 4, id, kToken, 10); });
  EXPECT_EQ(zero.get(), id);
  for (auto& f : ranks) EXPECT_EQ(f.get(), id);
}

TEST(Rendezvous, AWorldOfOneNeedsNoNetwork) { EXPECT_EQ(rendezvous_exchange("nowhere.invalid", 1, 0, 1, "x", ""), "x"); }

TEST(Rendezvous, AMissingRankZeroIsAnErrorAfterTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.1", test_port(1), 1, 2, "", kToken, 0.5); });
  EXPECT_NE(e.find("could not reach rank 0 within 0.5 s"), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(Rendezvous, MissingRanksAreAnErrorOnRankZero) {
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.1", test_port(2), 0, 3, "id", kToken, 0.5); });
  EXPECT_NE(e.find("only 0 of the 2 other ranks connected within 0.5 s"), std::string::npos) << e;
}

TEST(Rendezvous, BadArgumentsAreRefusedBeforeAnyNetworking) {
  EXPECT_NE(error_of([] { rendezvous_exchange("127.0.0.1", 0, 0, 2, "id", kToken); }).find("not a TCP port"), std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_exchange("127.0.0.1", 29501, 2, 2, "id", kToken); }).find("outside a world of 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_exchange("no-such-host.invalid", 29501, 1, 2, "", kToken, 1); }).find("cannot resolve"),
            std::string::npos);
}

// A peer speaking the hello by hand: returns what rank 0 sent back (empty when it hung up).
std::string raw_peer(int port, const std::string& bytes, double hold_s = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const auto t0 = std::chrono::steady_clock::now();
  while (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      ::close(fd);
      return "no connection";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!bytes.empty()) {
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);  // all said: a short hello ends here, not at rank 0's per-peer deadline
  }
  if (hold_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(hold_s));
  std::string got;
  char buf[512];
  for (ssize_t k; (k = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<size_t>(k));
  ::close(fd);
  return got;
}

std::string hello(uint32_t version, uint32_t rank, const std::string& token, const char* magic = "FRDZ") {
  std::string h(magic, 4);
  for (uint32_t v : {version, rank, static_cast<uint32_t>(token.size())}) {
    const uint32_t be = htonl(v);
    h.append(reinterpret_cast<const char*>(&be), 4);
  }
  return h + token;
}

// Rank 0 of a world of 2 on 127.0.0.1:port, started after the hostile peers connected.
std::future<std::string> rank_zero(int port, const std::string& id, double timeout_s = 10) {
  return std::async(std::launch::async, [=] { return rendezvous_exchange("127.0.0.1", port, 0, 2, id, kToken, timeout_s); });
}

TEST(Rendezvous, APeerWithAnotherTokenIsRefusedAndTakesNoRanksPlace) {
  const int port = test_port(3);
  const std::string id(256, 'b');
  auto zero = rank_zero(port, id);
  // A wrong token (same length and not), then rank 1's own hello by hand: only rank 1 gets the id.
  EXPECT_EQ(raw_peer(port, hello(1, 1, "job-secret-0124")), "");
  EXPECT_EQ(raw_peer(port, hello(1, 1, "x")), "");
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.1", port, 1, 2, "", "another-token", 10); });
  EXPECT_NE(e.find("rank 0 hung up without sending the NCCL id: it refused this rank"), std::string::npos) << e;
  EXPECT_EQ(rendezvous_exchange("127.0.0.1", port, 1, 2, "", kToken, 10), id);
  EXPECT_EQ(zero.get(), id);
}

TEST(Rendezvous, MalformedHellosAreRefusedWithoutHarm) {
  const int port = test_port(4);
  const std::string id(256, 'c');
  auto zero = rank_zero(port, id);
  EXPECT_EQ(raw_peer(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "");         // another protocol
  EXPECT_EQ(raw_peer(port, hello(2, 1, kToken)), "");                           // another version
  EXPECT_EQ(raw_peer(port, hello(1, 0, kToken)), "");                           // rank 0 is no peer
  EXPECT_EQ(raw_peer(port, hello(1, 7, kToken)), "");                           // outside the world
  EXPECT_EQ(raw_peer(port, hello(1, 1, std::string(), "FRDZ")), "");            // no token
  EXPECT_EQ(raw_peer(port, hello(1, 1, kToken).substr(0, 16) + std::string(4, 'z')), "");  // short token
  std::string huge = hello(1, 1, kToken);
  huge[15] = '\x7f';  // a token length of 127 + 2^24... bytes: refused before anything is read or allocated
  huge[12] = '\x7f';
  EXPECT_EQ(raw_peer(port, huge), "");
  EXPECT_EQ(rendezvous_exchange("127.0.0.1", port, 1, 2, "", kToken, 10), id);
  EXPECT_EQ(zero.get(), id);
}

TEST(Rendezvous, ARankIsServedOnce) {
  const int port = test_port(5);
  const std::string id(256, 'd');
  auto zero = std::async(std::launch::async, [&] { return rendezvous_exchange("127.0.0.1", port, 0, 3, id, kToken, 10); });
  EXPECT_EQ(rendezvous_exchange("127.0.0.1", port, 1, 3, "", kToken, 10), id);
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.1", port, 1, 3, "", kToken, 10); });
  EXPECT_NE(e.find("refused this rank"), std::string::npos) << e;
  EXPECT_EQ(rendezvous_exchange("127.0.0.1", port, 2, 3, "", kToken, 10), id);
  EXPECT_EQ(zero.get(), id);
}

TEST(Rendezvous, ASilentPeerIsDroppedAfterItsOwnDeadline) {
  const int port = test_port(6);
  const std::string id(256, 'e');
  auto zero = rank_zero(port, id, 30);
  const auto t0 = std::chrono::steady_clock::now();
  auto silent = std::async(std::launch::async, [&] { return raw_peer(port, "", 0); });  // connects, says nothing
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(rendezvous_exchange("127.0.0.1", port, 1, 2, "", kToken, 30), id);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(silent.get(), "");  // hung up on, after kRendezvousPeerSeconds
  EXPECT_GE(took, forge::parallel::kRendezvousPeerSeconds - 0.5);
  EXPECT_LT(took, forge::parallel::kRendezvousPeerSeconds + 5);
  EXPECT_EQ(zero.get(), id);
}

TEST(Rendezvous, RefusedPeersAreCountedInRankZerosTimeout) {
  const int port = test_port(7);
  auto zero = std::async(std::launch::async, [&] {
    return error_of([&] { rendezvous_exchange("127.0.0.1", port, 0, 2, "id", kToken, 1.5); });
  });
  EXPECT_EQ(raw_peer(port, hello(1, 1, "wrong")), "");
  const std::string e = zero.get();
  EXPECT_NE(e.find("only 0 of the 1 other ranks connected within 1.5 s (1 connection(s) refused: a wrong token"),
            std::string::npos) << e;
}

TEST(Rendezvous, RankZeroListensOnTheGivenAddressAlone) {
  // 127.0.0.2 is this host too (all of 127/8 is loopback), but not the address rank 0 was given.
  const int port = test_port(8);
  auto zero = std::async(std::launch::async, [&] {
    return error_of([&] { rendezvous_exchange("127.0.0.1", port, 0, 2, "id", kToken, 1.5); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string e = error_of([&] { rendezvous_exchange("127.0.0.2", port, 1, 2, "", kToken, 1); });
  EXPECT_NE(e.find("could not reach rank 0"), std::string::npos) << e;
  EXPECT_NE(zero.get().find("only 0 of the 1 other ranks"), std::string::npos);
}

TEST(Rendezvous, TheTokenComesFromTheEnvironment) {
  const char* saved = std::getenv("FORGE_RDZV_TOKEN");
  const std::string keep = saved ? saved : "";
  ::unsetenv("FORGE_RDZV_TOKEN");
  std::string e = error_of([] { forge::parallel::rendezvous_token_from_env(); });
  EXPECT_NE(e.find("FORGE_RDZV_TOKEN is not set"), std::string::npos) << e;
  EXPECT_NE(e.find("/dev/urandom"), std::string::npos) << e;
  ::setenv("FORGE_RDZV_TOKEN", std::string(300, 'k').c_str(), 1);
  e = error_of([] { forge::parallel::rendezvous_token_from_env(); });
  EXPECT_NE(e.find("FORGE_RDZV_TOKEN has 300 bytes; at most 256"), std::string::npos) << e;
  ::setenv("FORGE_RDZV_TOKEN", "s3cret", 1);
  EXPECT_EQ(forge::parallel::rendezvous_token_from_env(), "s3cret");
  if (saved) ::setenv("FORGE_RDZV_TOKEN", keep.c_str(), 1); else ::unsetenv("FORGE_RDZV_TOKEN");
}

TEST(Rendezvous, AMultiHostRankZeroRefusesALoopbackAddress) {
  const std::string e = error_of([&] { rendezvous_exchange("127.0.1.1", test_port(9), 0, 16, "id", kToken, 1, true); });
  EXPECT_NE(e.find("resolves to a loopback address on rank 0's host"), std::string::npos) << e;
  EXPECT_NE(e.find("torchrun --local-addr"), std::string::npos) << e;
}

}  // namespace
