#include "forge/dist/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "forge/core/error.h"

namespace forge::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

int ms_left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until fd is ready for `events` or the deadline passes (false then).
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

void send_all(int fd, const char* data, size_t n, Clock::time_point deadline, const std::string& where) {
  while (n > 0) {
    FORGE_CHECK(wait_fd(fd, POLLOUT, deadline), "rendezvous ", where, ": timed out sending the NCCL id");
    const ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    FORGE_CHECK(k > 0, "rendezvous ", where, ": send failed: ", std::strerror(errno));
    data += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, char* data, size_t n, Clock::time_point deadline, const std::string& where) {
  while (n > 0) {
    FORGE_CHECK(wait_fd(fd, POLLIN, deadline), "rendezvous ", where, ": timed out waiting for rank 0's NCCL id");
    const ssize_t k = ::recv(fd, data, n, 0);
    if (k < 0 && errno == EINTR) continue;
    FORGE_CHECK(k > 0, "rendezvous ", where, ": rank 0 hung up before sending the NCCL id",
                k < 0 ? std::string(": ") + std::strerror(errno) : std::string());
    data += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace

std::string rendezvous_exchange(const std::string& addr, int port, int rank, int world_size, const std::string& payload,
                                double timeout_s) {
  FORGE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rendezvous: rank ", rank, " outside a world of ",
              world_size);
  FORGE_CHECK(port > 0 && port < 65536, "rendezvous: port ", port, " is not a TCP port (MASTER_PORT + 1)");
  FORGE_CHECK(timeout_s > 0, "rendezvous: the timeout must be > 0 s");
  if (world_size == 1) return payload;
  const std::string where = addr + ":" + std::to_string(port) + " (rank " + std::to_string(rank) + " of " +
                            std::to_string(world_size) + ")";
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));

  if (rank == 0) {
    FORGE_CHECK(!payload.empty() && payload.size() < (1u << 20), "rendezvous: rank 0's payload has ", payload.size(),
                " bytes");
    Fd s(::socket(AF_INET6, SOCK_STREAM, 0));
    const bool v6 = s.fd >= 0;
    if (!v6) s.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    FORGE_CHECK(s.fd >= 0, "rendezvous ", where, ": socket: ", std::strerror(errno));
    int one = 1, zero = 0;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    int rc;
    if (v6) {
      ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 clients too
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    if (rc != 0 && v6 && errno != EADDRINUSE) {  // IPv6 unavailable: IPv4 only
      ::close(s.fd);
      s.fd = ::socket(AF_INET, SOCK_STREAM, 0);
      FORGE_CHECK(s.fd >= 0, "rendezvous ", where, ": socket: ", std::strerror(errno));
      ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    }
    FORGE_CHECK(rc == 0, "rendezvous ", where, ": cannot listen on port ", port, ": ", std::strerror(errno),
                "; forge uses MASTER_PORT + 1 for the NCCL id: choose a MASTER_PORT whose next port is free");
    FORGE_CHECK(::listen(s.fd, world_size) == 0, "rendezvous ", where, ": listen: ", std::strerror(errno));
    const uint32_t len = htonl(static_cast<uint32_t>(payload.size()));
    for (int served = 0; served < world_size - 1;) {
      FORGE_CHECK(wait_fd(s.fd, POLLIN, deadline), "rendezvous ", where, ": only ", served, " of the ", world_size - 1,
                  " other ranks connected within ", timeout_s, " s; check that every rank started and can reach ", addr,
                  " (MASTER_ADDR)");
      Fd c(::accept(s.fd, nullptr, nullptr));
      if (c.fd < 0) {
        FORGE_CHECK(errno == EINTR || errno == ECONNABORTED, "rendezvous ", where, ": accept: ", std::strerror(errno));
        continue;
      }
      send_all(c.fd, reinterpret_cast<const char*>(&len), sizeof(len), deadline, where);
      send_all(c.fd, payload.data(), payload.size(), deadline, where);
      ++served;
    }
    return payload;
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int g = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  FORGE_CHECK(g == 0 && res != nullptr, "rendezvous ", where, ": cannot resolve MASTER_ADDR '", addr,
              "': ", ::gai_strerror(g));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  // Rank 0 may not listen yet: retry every 50 ms until the deadline.
  for (;;) {
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      Fd c(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (c.fd < 0) continue;
      if (::connect(c.fd, ai->ai_addr, ai->ai_addrlen) != 0) continue;
      uint32_t len = 0;
      recv_all(c.fd, reinterpret_cast<char*>(&len), sizeof(len), deadline, where);
      len = ntohl(len);
      FORGE_CHECK(len > 0 && len < (1u << 20), "rendezvous ", where, ": bad payload length ", len,
                  " (is something other than forge's rank 0 listening on that port?)");
      std::string out(len, '\0');
      recv_all(c.fd, out.data(), len, deadline, where);
      return out;
    }
    FORGE_CHECK(ms_left(deadline) > 0, "rendezvous ", where, ": could not reach rank 0 within ", timeout_s,
                " s; check MASTER_ADDR / MASTER_PORT and that rank 0 started (forge uses MASTER_PORT + 1)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace forge::dist
