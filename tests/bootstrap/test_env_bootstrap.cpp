// env_bootstrap between real processes: each case starts one epcomm_env_rank per rank, with the
// variables torchrun would set, and checks what every rank reports (see epcomm_env_rank.cpp).
#include "epcomm/bootstrap/env.hpp"

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

static_assert(epcomm::bootstrap<epcomm::env_bootstrap>);

namespace {

using namespace std::chrono_literals;
using vars = std::map<std::string, std::string>;

// Children see these only as each case sets them, whatever this process inherited.
constexpr const char* launcher_vars[] = {
    "RANK",          "WORLD_SIZE",         "LOCAL_RANK",         "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",   "MASTER_PORT",        "EPCOMM_MASTER_PORT", "EPCOMM_TIMEOUT_MS",
    "EPCOMM_JOB_ID", "TORCHELASTIC_RUN_ID"};

// No case needs more than a few seconds; a child still running after this is hung.
constexpr auto hard_limit = 30s;

struct rank_spec {
  vars env;
  std::vector<std::string> args;  // For epcomm_env_rank: scenario, timeout ms, [rank].
};

struct report {
  int exit_code = -1;  // -1 when killed by a signal, -2 when it could not be started.
  std::string text;

  bool ok() const { return exit_code == 0 && text.starts_with("ok"); }
  bool failed() const { return exit_code == 1 && text.starts_with("error "); }
  int peer() const { return field("peer="); }
  int ms() const { return field("ms="); }
  bool says(const std::string& s) const { return text.find(s) != std::string::npos; }

 private:
  int field(const std::string& key) const {
    const std::size_t at = text.find(key);
    return at == std::string::npos ? -999 : std::stoi(text.substr(at + key.size()));
  }
};

// A loopback TCP socket bound to `port` (0: the kernel picks one); invalid if it is taken.
epcomm::detail::tcp::socket bound(int port) {
  epcomm::detail::tcp::socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return {};
  return s;
}

int port_of(const epcomm::detail::tcp::socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  return ntohs(addr.sin_port);
}

// A port p nobody uses right now, with p + 1 free too: torchrun's store would hold MASTER_PORT =
// p, and epcomm's rendezvous defaults to p + 1.
int free_port_pair() {
  for (;;) {
    const int p = port_of(bound(0));
    if (p < 65535 && bound(p + 1).valid()) return p;
  }
}

// `world` ranks on this host, as torchrun would start them (with its run id), all running `args`.
std::vector<rank_spec> job(int world, const std::vector<std::string>& args,
                           const std::string& addr = "127.0.0.1") {
  const std::string port = std::to_string(free_port_pair());
  std::vector<rank_spec> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back({{{"RANK", std::to_string(r)},
                      {"WORLD_SIZE", std::to_string(world)},
                      {"MASTER_ADDR", addr},
                      {"MASTER_PORT", port},
                      {"TORCHELASTIC_RUN_ID", "job-a"}},
                     args});
  }
  return ranks;
}

int rendezvous_port(const rank_spec& spec) {
  const auto explicit_port = spec.env.find("EPCOMM_MASTER_PORT");
  return explicit_port != spec.env.end() ? std::stoi(explicit_port->second)
                                         : std::stoi(spec.env.at("MASTER_PORT")) + 1;
}

// Connects to 127.0.0.1:port, retrying while nobody listens there yet, and sends `bytes`; the
// connection stays open until the returned socket is destroyed.
epcomm::detail::tcp::socket intrude(int port, const std::string& bytes) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    epcomm::detail::tcp::socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      if (!bytes.empty()) REQUIRE(::send(s.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL) > 0);
      return s;
    }
    std::this_thread::sleep_for(5ms);
  }
  FAIL("nobody listened on port " << port);
  return {};
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (std::string& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// Every rank's output, for the failure messages.
std::string transcript(const std::vector<report>& reports) {
  std::string s;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    s += "\n[rank " + std::to_string(r) + ", exit " + std::to_string(reports[r].exit_code) + "] " +
         reports[r].text;
  }
  return s;
}

// Starts every rank, waits for all of them (killing any still running at hard_limit) and
// returns what each printed.
std::vector<report> run(const std::vector<rank_spec>& ranks) {
  struct child {
    pid_t pid;
    int out;  // A memfd holding the child's stdout and stderr.
    int status = 0;
  };
  std::vector<child> children;
  for (const rank_spec& spec : ranks) {
    // Built before fork(): between fork and exec the child may only make async-signal-safe calls.
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      if (std::ranges::find(launcher_vars, name) == std::end(launcher_vars)) {
        env_strings.push_back(entry);
      }
    }
    for (const auto& [name, value] : spec.env) env_strings.push_back(name + "=" + value);
    std::vector<std::string> arg_strings{EPCOMM_ENV_RANK};
    arg_strings.insert(arg_strings.end(), spec.args.begin(), spec.args.end());
    const std::vector<char*> envp = pointers(env_strings), argv = pointers(arg_strings);

    const int out = ::memfd_create("epcomm_env_rank", MFD_CLOEXEC);
    const pid_t pid = out >= 0 ? ::fork() : -1;
    if (pid == 0) {
      // Should CTest kill this test on its timeout, the ranks go with it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    children.push_back({pid, out});
  }

  const auto give_up = std::chrono::steady_clock::now() + hard_limit;
  bool killed = false;
  for (bool running = true; running;) {
    running = false;
    for (child& c : children) {
      if (c.pid > 0 && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.pid = 0;
      running = running || c.pid > 0;
    }
    if (running && std::chrono::steady_clock::now() > give_up) {
      for (child& c : children) {
        if (c.pid <= 0) continue;
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.pid = 0;
      }
      killed = true;
      break;
    }
    std::this_thread::sleep_for(2ms);
  }

  std::vector<report> reports;
  for (const child& c : children) {
    report r;
    r.exit_code = c.pid < 0 ? -2 : WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -1;
    if (c.out >= 0) {
      ::lseek(c.out, 0, SEEK_SET);
      char buf[4096];
      for (ssize_t n; (n = ::read(c.out, buf, sizeof buf)) > 0;) r.text.append(buf, n);
      ::close(c.out);
    }
    reports.push_back(r);
  }
  if (killed) {
    FAIL("ranks still running after " << hard_limit.count()
                                      << " s were killed:" << transcript(reports));
  }
  return reports;
}

}  // namespace

TEST_CASE("all_gather returns every rank's block in rank order, for 1, 2 and 4 ranks") {
  for (const int world : {1, 2, 4}) {
    CAPTURE(world);
    // Two ranks resolve "localhost" and leave LOCAL_* unset (one node); four run as two nodes.
    std::vector<rank_spec> ranks =
        job(world, {"gather", "10000"}, world == 2 ? "localhost" : "127.0.0.1");
    if (world == 4) {
      for (int r = 0; r < world; ++r) {
        ranks[r].env["LOCAL_RANK"] = std::to_string(r % 2);
        ranks[r].env["LOCAL_WORLD_SIZE"] = "2";
      }
    }
    const std::vector<report> reports = run(ranks);
    INFO(transcript(reports));
    for (const report& r : reports) CHECK(r.ok());
  }
}

TEST_CASE("a rank that exits early is named in every survivor's error, long before the deadline") {
  struct scenario {
    int world;
    int victim;
  };
  for (const scenario s : {scenario{4, 3}, scenario{4, 0}, scenario{2, 1}}) {
    CAPTURE(s.world);
    CAPTURE(s.victim);
    const std::vector<report> reports =
        run(job(s.world, {"exit", "10000", std::to_string(s.victim)}));
    INFO(transcript(reports));
    for (int r = 0; r < s.world; ++r) {
      const report& got = reports[r];
      if (r == s.victim) {
        CHECK(got.text == "exited\n");
        continue;
      }
      REQUIRE(got.failed());
      CHECK(got.peer() == s.victim);
      CHECK(got.says("connection to rank " + std::to_string(s.victim) + " lost during all_gather"));
      CHECK(got.ms() < 5000);  // The operation's deadline is 20 s.
    }
  }
}

TEST_CASE("mismatched block sizes fail every rank") {
  SUBCASE("a member is the odd one out: every rank names it") {
    const std::vector<report> reports = run(job(4, {"mismatch", "10000", "2"}));
    INFO(transcript(reports));
    for (const report& r : reports) {
      REQUIRE(r.failed());
      CHECK(r.peer() == 2);
      CHECK(r.says("rank 2 passed 5 bytes to all_gather but rank 0 passed 4"));
      CHECK(r.ms() < 5000);
    }
  }
  SUBCASE("rank 0 is the odd one out") {
    const std::vector<report> reports = run(job(3, {"mismatch", "10000", "0"}));
    INFO(transcript(reports));
    for (const report& r : reports) {
      REQUIRE(r.failed());
      CHECK(r.says("bytes to all_gather but rank 0 passed 5"));
    }
  }
}

TEST_CASE("a rendezvous that contradicts itself fails on both sides") {
  SUBCASE("two processes claim the same rank") {
    std::vector<rank_spec> ranks = job(3, {"connect", "10000"});
    ranks[2].env["RANK"] = "1";
    const std::vector<report> reports = run(ranks);
    INFO(transcript(reports));
    for (const report& r : reports) {
      REQUIRE(r.failed());
      CHECK(r.says("two processes claim RANK=1"));
      CHECK(r.ms() < 5000);
    }
  }
  SUBCASE("a member disagrees on the world size") {
    std::vector<rank_spec> ranks = job(2, {"connect", "10000"});
    ranks[1].env["WORLD_SIZE"] = "3";
    const std::vector<report> reports = run(ranks);
    INFO(transcript(reports));
    for (const report& r : reports) {
      REQUIRE(r.failed());
      CHECK(r.says("rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"));
      CHECK(r.ms() < 5000);
    }
  }
}

TEST_CASE("with nobody listening at MASTER_ADDR:MASTER_PORT a member fails at the deadline") {
  std::vector<rank_spec> ranks = job(2, {"connect", "500"});
  ranks.erase(ranks.begin());  // No rank 0.
  const std::vector<report> reports = run(ranks);
  INFO(transcript(reports));
  REQUIRE(reports[0].failed());
  CHECK(reports[0].peer() == 0);
  CHECK(reports[0].says("could not reach rank 0"));
  CHECK(reports[0].ms() >= 500);
  CHECK(reports[0].ms() < 2000);
}

TEST_CASE("missing or malformed variables are named in the error") {
  struct bad_env {
    vars changes;  // An empty value unsets the variable.
    std::string named;
  };
  const bad_env cases[] = {
      {{{"RANK", ""}}, "RANK is not set"},
      {{{"WORLD_SIZE", ""}}, "WORLD_SIZE is not set"},
      {{{"MASTER_ADDR", ""}}, "MASTER_ADDR is not set"},
      {{{"MASTER_PORT", ""}}, "EPCOMM_MASTER_PORT (or MASTER_PORT) is not set"},
      {{{"RANK", "one"}}, "RANK='one' is not an integer"},
      {{{"WORLD_SIZE", "2x"}}, "WORLD_SIZE='2x' is not an integer"},
      {{{"RANK", "2"}}, "RANK=2 is outside [0, WORLD_SIZE=2)"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 is not positive"},
      {{{"MASTER_PORT", "70000"}},
       "the rendezvous port 70001 (EPCOMM_MASTER_PORT, else MASTER_PORT + 1) is not a TCP port"},
      {{{"EPCOMM_MASTER_PORT", "0"}}, "the rendezvous port 0 (EPCOMM_MASTER_PORT"},
      {{{"TORCHELASTIC_RUN_ID", std::string(300, 'j')}},
       "the job id (EPCOMM_JOB_ID or TORCHELASTIC_RUN_ID) has 300 bytes, more than 256"},
      {{{"LOCAL_RANK", "0"}}, "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not"},
      {{{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}, "LOCAL_RANK=2 is outside"},
      {{{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "3"}}, "LOCAL_WORLD_SIZE=3 is outside"},
  };
  for (const bad_env& c : cases) {
    CAPTURE(c.named);
    // Rank 1 of 2, so that a valid configuration would try to connect; the errors come first.
    std::vector<rank_spec> ranks = job(2, {"connect", "500"});
    rank_spec& spec = ranks[1];
    for (const auto& [name, value] : c.changes) {
      if (value.empty()) {
        spec.env.erase(name);
      } else {
        spec.env[name] = value;
      }
    }
    const std::vector<report> reports = run({spec});
    INFO(transcript(reports));
    REQUIRE(reports[0].failed());
    CHECK(reports[0].says(c.named));
    CHECK(reports[0].ms() < 400);
  }
}

TEST_CASE("a single rank needs neither MASTER_ADDR nor MASTER_PORT") {
  const std::vector<report> reports =
      run({{{{"RANK", "0"}, {"WORLD_SIZE", "1"}}, {"connect", "500"}}});
  INFO(transcript(reports));
  CHECK(reports[0].ok());
}

TEST_CASE(
    "the rendezvous listens on MASTER_PORT + 1 beside torchrun's store, or on EPCOMM_MASTER_PORT") {
  SUBCASE("by default, with MASTER_PORT held as torchrun's store holds it") {
    std::vector<rank_spec> ranks = job(3, {"gather", "10000"});
    const auto store = bound(std::stoi(ranks[0].env["MASTER_PORT"]));
    REQUIRE(store.valid());
    REQUIRE(::listen(store.fd(), 4) == 0);
    const std::vector<report> reports = run(ranks);
    INFO(transcript(reports));
    for (const report& r : reports) CHECK(r.ok());
  }
  SUBCASE("EPCOMM_MASTER_PORT wins over MASTER_PORT") {
    std::vector<rank_spec> ranks = job(2, {"connect", "10000"});
    // Something else holds MASTER_PORT + 1: rank 0 could not listen there.
    const auto taken = bound(std::stoi(ranks[0].env["MASTER_PORT"]) + 1);
    REQUIRE(taken.valid());
    REQUIRE(::listen(taken.fd(), 4) == 0);
    const int mine = port_of(bound(0));
    for (rank_spec& r : ranks) r.env["EPCOMM_MASTER_PORT"] = std::to_string(mine);
    const std::vector<report> reports = run(ranks);
    INFO(transcript(reports));
    for (const report& r : reports) CHECK(r.ok());
  }
}

TEST_CASE(
    "rank 0 admits only its job: another job's process is refused, the job forms without it") {
  std::vector<rank_spec> ranks = job(3, {"late", "10000", "400"});
  ranks[0].args = {"connect", "10000"};
  rank_spec intruder = ranks[1];  // RANK=1 of the same size, but of another job, and early
  intruder.env["TORCHELASTIC_RUN_ID"] = "job-b";
  intruder.args = {"connect", "10000"};
  ranks.push_back(intruder);
  const std::vector<report> reports = run(ranks);
  INFO(transcript(reports));
  for (int r = 0; r < 3; ++r) CHECK(reports[r].ok());
  REQUIRE(reports[3].failed());
  CHECK(reports[3].peer() == 0);
  CHECK(reports[3].says("refused: rank 0 belongs to job 'job-a'"));
  CHECK(reports[3].says("claiming RANK=1 to job 'job-b'"));
  CHECK(reports[3].ms() < 5000);

  SUBCASE("EPCOMM_JOB_ID overrides TORCHELASTIC_RUN_ID") {
    std::vector<rank_spec> pair = job(2, {"connect", "10000"});
    pair[0].env["EPCOMM_JOB_ID"] = "mine";
    pair[1].env["EPCOMM_JOB_ID"] = "mine";
    pair[1].env["TORCHELASTIC_RUN_ID"] = "other";
    const std::vector<report> got = run(pair);
    INFO(transcript(got));
    for (const report& r : got) CHECK(r.ok());
  }
}

TEST_CASE(
    "strangers and half-open connections do not hold up the job, and are named at the deadline") {
  SUBCASE("the job forms around them") {
    std::vector<rank_spec> ranks = job(3, {"late", "10000", "400"});
    ranks[0].args = {"connect", "10000"};
    std::vector<epcomm::detail::tcp::socket> held;
    std::thread strangers([&] {
      const int port = rendezvous_port(ranks[0]);
      held.push_back(intrude(port, "GET / HTTP/1.1\r\n\r\n"));  // not a hello
      held.push_back(intrude(port, ""));                        // half-open: says nothing
      held.push_back(intrude(port, std::string("EPB2", 4)));    // starts a hello, stops
    });
    const std::vector<report> reports = run(ranks);
    strangers.join();
    INFO(transcript(reports));
    for (const report& r : reports) CHECK(r.ok());
  }
  SUBCASE("a rendezvous that times out names what rank 0 turned away") {
    std::vector<rank_spec> ranks = job(2, {"connect", "1500"});
    ranks.pop_back();  // rank 1 never comes
    std::vector<epcomm::detail::tcp::socket> held;
    std::thread strangers([&] {
      const int port = rendezvous_port(ranks[0]);
      held.push_back(intrude(port, "\x16\x03\x01"));  // a TLS client hello, say
      held.push_back(intrude(port, std::string("EPB2\x02\0\0\0", 8)));
    });
    const std::vector<report> reports = run(ranks);
    strangers.join();
    INFO(transcript(reports));
    REQUIRE(reports[0].failed());
    CHECK(reports[0].peer() == 1);
    CHECK(reports[0].says("1 of 2 ranks had connected; turned away: a stranger at 127.0.0.1:"));
    CHECK(reports[0].says("(not an epcomm bootstrap hello)"));
    CHECK(reports[0].says("sent 8 bytes of its hello"));
  }
}
