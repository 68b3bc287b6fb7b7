#include "forge/parallel/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "forge/core/error.h"

namespace forge::parallel {
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

// The hello a peer sends: "FRDZ", version, rank, token length (u32 each, big-endian), token.
constexpr char kHelloMagic[4] = {'F', 'R', 'D', 'Z'};
constexpr uint32_t kHelloVersion = 1;

std::string hello_of(int rank, const std::string& token) {
  std::string h(kHelloMagic, 4);
  for (uint32_t v : {kHelloVersion, static_cast<uint32_t>(rank), static_cast<uint32_t>(token.size())}) {
    const uint32_t be = htonl(v);
    h.append(reinterpret_cast<const char*>(&be), 4);
  }
  return h + token;
}

bool same_token(const std::string& a, const std::string& b) {  // constant time in the secret's bytes
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// Reads exactly n bytes before `deadline`; false on a timeout, an error or a hang-up.
bool read_exactly(int fd, char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t k = ::recv(fd, data, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// connect() bounded in time: a host that drops the SYN would otherwise block for the kernel's
// retries (minutes), past the deadline. Up to 2 s an attempt; the caller retries until its deadline.
bool connect_within(int fd, const sockaddr* addr, socklen_t len, Clock::time_point deadline) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return ::connect(fd, addr, len) == 0;
  bool ok = ::connect(fd, addr, len) == 0;
  if (!ok && errno == EINPROGRESS &&
      wait_fd(fd, POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(2)))) {
    int err = 0;
    socklen_t n = sizeof err;
    ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) == 0 && err == 0;
  }
  ::fcntl(fd, F_SETFL, flags);  // blocking again: send_all / read_exactly poll before each call
  return ok;
}

// Rank 0's sockets on MASTER_ADDR's own interfaces (never every interface): one per address the
// name resolves to (a name may give an IPv6 and an IPv4 address; the peers may try either).
bool is_loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

std::vector<std::unique_ptr<Fd>> listen_on(const std::string& addr, int port, int backlog, bool multi_host,
                                           const std::string& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int g = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  FORGE_CHECK(g == 0 && res != nullptr, "rendezvous ", where, ": cannot resolve MASTER_ADDR '", addr, "': ",
              ::gai_strerror(g));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  bool all_loopback = true;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) all_loopback = all_loopback && is_loopback(ai->ai_addr);
  FORGE_CHECK(!multi_host || !all_loopback, "rendezvous ", where, ": MASTER_ADDR '", addr,
              "' resolves to a loopback address on rank 0's host, which the ranks on other hosts cannot reach (a host "
              "name mapped to 127.0.1.1 in /etc/hosts?); give rank 0's reachable address: torchrun --local-addr <ip> "
              "(c10d rendezvous) or --master-addr <ip>");
  std::vector<std::unique_ptr<Fd>> out;
  std::string why = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    auto s = std::make_unique<Fd>(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
    if (s->fd < 0) continue;
    int one = 1;
    ::setsockopt(s->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) ::setsockopt(s->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(s->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      why = std::strerror(errno);
      FORGE_CHECK(errno != EADDRINUSE, "rendezvous ", where, ": cannot listen on port ", port, ": ", why,
                  "; forge uses MASTER_PORT + 1 for the NCCL id: choose a MASTER_PORT whose next port is free");
      continue;
    }
    FORGE_CHECK(::listen(s->fd, backlog) == 0, "rendezvous ", where, ": listen: ", std::strerror(errno));
    out.push_back(std::move(s));
  }
  FORGE_CHECK(!out.empty(), "rendezvous ", where, ": rank 0 cannot listen on MASTER_ADDR '", addr, "' (", why,
              "): rank 0 listens on that address's interface alone, so MASTER_ADDR must name rank 0's host");
  return out;
}

// Waits for a connection on any of `listeners`; the ready one's fd, or -1 when the deadline passes.
int wait_any(const std::vector<std::unique_ptr<Fd>>& listeners, Clock::time_point deadline) {
  std::vector<pollfd> p;
  for (const auto& l : listeners) p.push_back({l->fd, POLLIN, 0});
  for (;;) {
    const int n = ::poll(p.data(), p.size(), ms_left(deadline));
    if (n == 0 || (n < 0 && errno != EINTR)) return -1;
    if (n > 0)
      for (const auto& q : p)
        if (q.revents != 0) return q.fd;  // POLLIN, or an error that accept() then names
  }
}

}  // namespace

std::string rendezvous_token_from_env() {
  const char* t = std::getenv("FORGE_RDZV_TOKEN");
  FORGE_CHECK(t != nullptr && *t != '\0', "rendezvous: FORGE_RDZV_TOKEN is not set. A job started by torchrun hands its "
              "NCCL id to the ranks only with the job's token (SECURITY.md); set it to the same secret on every rank, "
              "e.g. export FORGE_RDZV_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n') before torchrun "
              "(or start the job with forge launch, mpirun or srun)");
  const std::string token = t;
  FORGE_CHECK(token.size() <= kRendezvousMaxToken, "rendezvous: FORGE_RDZV_TOKEN has ", token.size(),
              " bytes; at most ", kRendezvousMaxToken);
  return token;
}

std::string rendezvous_exchange(const std::string& addr, int port, int rank, int world_size, const std::string& payload,
                                const std::string& token, double timeout_s, bool multi_host) {
  FORGE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rendezvous: rank ", rank, " outside a world of ",
              world_size);
  FORGE_CHECK(port > 0 && port < 65536, "rendezvous: port ", port, " is not a TCP port (MASTER_PORT + 1)");
  FORGE_CHECK(timeout_s > 0, "rendezvous: the timeout must be > 0 s");
  if (world_size == 1) return payload;
  FORGE_CHECK(!token.empty() && token.size() <= kRendezvousMaxToken, "rendezvous: the job's token must have 1 to ",
              kRendezvousMaxToken, " bytes (FORGE_RDZV_TOKEN)");
  const std::string where = addr + ":" + std::to_string(port) + " (rank " + std::to_string(rank) + " of " +
                            std::to_string(world_size) + ")";
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));

  if (rank == 0) {
    FORGE_CHECK(!payload.empty() && payload.size() < (1u << 20), "rendezvous: rank 0's payload has ", payload.size(),
                " bytes");
    const auto listeners = listen_on(addr, port, world_size, multi_host, where);
    const uint32_t len = htonl(static_cast<uint32_t>(payload.size()));
    std::vector<bool> served(static_cast<size_t>(world_size), false);
    int count = 0, refused = 0;
    while (count < world_size - 1) {
      const int ready = wait_any(listeners, deadline);
      FORGE_CHECK(ready >= 0, "rendezvous ", where, ": only ", count, " of the ", world_size - 1,
                  " other ranks connected within ", timeout_s, " s", refused ? " (" + std::to_string(refused) +
                  " connection(s) refused: a wrong token (FORGE_RDZV_TOKEN), a bad or repeated rank, or no hello)" : "",
                  "; check that every rank started with the same FORGE_RDZV_TOKEN and can reach ", addr, " (MASTER_ADDR)");
      Fd c(::accept(ready, nullptr, nullptr));
      if (c.fd < 0) {
        FORGE_CHECK(errno == EINTR || errno == ECONNABORTED, "rendezvous ", where, ": accept: ", std::strerror(errno));
        continue;
      }
      // Note [rendezvous trust]: the peer's hello within its own deadline, bounded in size.
      const auto peer_deadline = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                                       std::chrono::duration<double>(kRendezvousPeerSeconds)));
      char head[16];
      bool ok = read_exactly(c.fd, head, sizeof head, peer_deadline) && std::memcmp(head, kHelloMagic, 4) == 0;
      uint32_t fields[3] = {0, 0, 0};
      if (ok) {
        std::memcpy(fields, head + 4, sizeof fields);
        for (auto& f : fields) f = ntohl(f);
        ok = fields[0] == kHelloVersion && fields[1] >= 1 && fields[1] < static_cast<uint32_t>(world_size) &&
             !served[fields[1]] && fields[2] >= 1 && fields[2] <= kRendezvousMaxToken;
      }
      std::string theirs(ok ? fields[2] : 0, '\0');
      ok = ok && read_exactly(c.fd, theirs.data(), theirs.size(), peer_deadline) && same_token(theirs, token);
      if (!ok) {
        ++refused;
        continue;  // closed by Fd: the peer is not served, and no rank's place is taken
      }
      send_all(c.fd, reinterpret_cast<const char*>(&len), sizeof(len), deadline, where);
      send_all(c.fd, payload.data(), payload.size(), deadline, where);
      served[fields[1]] = true;
      ++count;
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
  const std::string hello = hello_of(rank, token);
  // Rank 0 may not listen yet: retry every 50 ms until the deadline.
  for (;;) {
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      Fd c(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (c.fd < 0) continue;
      if (!connect_within(c.fd, ai->ai_addr, ai->ai_addrlen, deadline)) continue;
      send_all(c.fd, hello.data(), hello.size(), deadline, where);
      uint32_t len = 0;
      FORGE_CHECK(read_exactly(c.fd, reinterpret_cast<char*>(&len), sizeof(len), deadline), "rendezvous ", where,
                  ": rank 0 hung up without sending the NCCL id: it refused this rank (is FORGE_RDZV_TOKEN the same on "
                  "every rank, and this rank served only once?)");
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

}  // namespace forge::parallel
