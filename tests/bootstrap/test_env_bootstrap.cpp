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
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",       "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "EPCOMM_TIMEOUT_MS"};

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

// A port nobody uses right now: the kernel picks it for a socket that is closed again at once.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// `world` ranks on this host, as torchrun would start them, all running `args`.
std::vector<rank_spec> job(int world, const std::vector<std::string>& args,
                           const std::string& addr = "127.0.0.1") {
  const std::string port = std::to_string(free_port());
  std::vector<rank_spec> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back({{{"RANK", std::to_string(r)},
                      {"WORLD_SIZE", std::to_string(world)},
                      {"MASTER_ADDR", addr},
                      {"MASTER_PORT", port}},
                     args});
  }
  return ranks;
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
      {{{"MASTER_PORT", ""}}, "MASTER_PORT is not set"},
      {{{"RANK", "one"}}, "RANK='one' is not an integer"},
      {{{"WORLD_SIZE", "2x"}}, "WORLD_SIZE='2x' is not an integer"},
      {{{"RANK", "2"}}, "RANK=2 is outside [0, WORLD_SIZE=2)"},
      {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 is not positive"},
      {{{"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is not a TCP port"},
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
