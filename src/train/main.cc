// shardpoint-train: trains the demo Transformer language model with FSDPStrategy and writes
// Lightning-layout checkpoints.
//
//   shardpoint-train --devices N --strategy fsdp --state-dict-type full|sharded --max-steps S
//                    --root DIR [--ckpt-path PATH] [--data DIR] [--optimizer sgd|adam|adamw]
//                    [--model-size tiny|demo|1b-shape] [--lr X] [--seed N] [--global-batch B]
//
// With --devices N > 1 and no RANK/WORLD_SIZE in the environment it starts N copies of itself
// as ranks 0..N-1 (torchrun's variables, MASTER_ADDR 127.0.0.1 and a free port) and waits for
// them; under a launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or mpirun) it joins.
// Rank 0 prints one line per step (step, loss, tokens/s) and the time of each checkpoint.
// Exit codes: 0 ok, 2 usage or run error (one "shardpoint-train: " line on stderr per rank).
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator_from_env.h"
#include "core/error.h"
#include "train/trainer.h"

extern char** environ;

namespace shardpoint::train {
namespace {

#ifndef SP_DEFAULT_DATA_DIR
#define SP_DEFAULT_DATA_DIR "data/tiny-wikitext"
#endif

struct Args {
  int devices = 1;
  std::string strategy = "fsdp";
  std::string state_dict_type = "full";
  std::int64_t max_steps = 3;
  std::string root = ".";
  std::string ckpt_path;
  std::string data = SP_DEFAULT_DATA_DIR;
  std::string optimizer = "sgd";
  std::string model_size = "tiny";
  double lr = -1;
  double momentum = 0;
  std::uint64_t seed = 0;
  std::int64_t global_batch = 4;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", k));
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> std::int64_t {
      try {
        std::size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        return n;
      } catch (const std::exception&) {
        throw UsageError(fmt::format("{}: \"{}\" is not an integer", k, v));
      }
    };
    if (k == "--devices") a.devices = static_cast<int>(number(value()));
    else if (k == "--strategy") a.strategy = value();
    else if (k == "--state-dict-type") a.state_dict_type = value();
    else if (k == "--max-steps") a.max_steps = number(value());
    else if (k == "--root") a.root = value();
    else if (k == "--ckpt-path") a.ckpt_path = value();
    else if (k == "--data") a.data = value();
    else if (k == "--optimizer") a.optimizer = value();
    else if (k == "--model-size") a.model_size = value();
    else if (k == "--lr") a.lr = std::stod(value());
    else if (k == "--momentum") a.momentum = std::stod(value());
    else if (k == "--seed") a.seed = static_cast<std::uint64_t>(number(value()));
    else if (k == "--global-batch") a.global_batch = number(value());
    else if (k == "-h" || k == "--help") {
      std::printf(
          "usage: shardpoint-train --devices N --strategy fsdp --state-dict-type full|sharded --max-steps S --root DIR\n"
          "       [--ckpt-path PATH] [--data DIR] [--optimizer sgd|adam|adamw] [--model-size tiny|demo|1b-shape]\n"
          "       [--lr X] [--momentum M (sgd)] [--seed N] [--global-batch B]\n");
      std::exit(0);
    } else {
      throw UsageError(fmt::format("unknown argument \"{}\"", k));
    }
  }
  if (a.strategy != "fsdp") throw UsageError(fmt::format("unknown strategy \"{}\" (expected fsdp)", a.strategy));
  if (a.devices < 1) throw UsageError("--devices must be >= 1");
  if (a.max_steps < 0) throw UsageError("--max-steps must be >= 0");
  if (a.global_batch < 1) throw UsageError("--global-batch must be >= 1");
  if (a.momentum != 0 && a.optimizer != "sgd") throw UsageError("--momentum applies to --optimizer sgd only");
  return a;
}

int free_port() {
  std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = std::uniform_int_distribution<int>(21000, 28999)(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (ok) return port;
  }
  throw UsageError("no free port for MASTER_PORT");
}

// Starts `devices` copies of this program as ranks and returns the worst exit code.
int spawn_ranks(int devices, int argc, char** argv) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < devices; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.push_back(fmt::format("RANK={}", r));
    env.push_back(fmt::format("LOCAL_RANK={}", r));
    env.push_back(fmt::format("WORLD_SIZE={}", devices));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back(fmt::format("MASTER_PORT={}", port));
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
    if (rc != 0) throw Error(fmt::format("cannot start rank {}: {}", r, std::strerror(rc)));
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
    worst = std::max(worst, code);
  }
  return worst;
}

int try_main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  FSDPStrategy strategy(a.state_dict_type);  // validates before any rank starts
  if (a.devices > 1 && std::getenv("RANK") == nullptr && !comm::launched_by_mpirun()) {
    return spawn_ranks(a.devices, argc, argv);
  }
  at::set_num_threads(1);  // ranks share the cores
  auto comm = comm::make_communicator_from_env(comm::CommOptions{std::chrono::seconds(120)});
  const TextCorpus data = TextCorpus::load(a.data);
  ModelConfig model = model_config(a.model_size);
  model.vocab_size = a.model_size == "tiny" ? data.vocab_size() : std::max<std::int64_t>(model.vocab_size, data.vocab_size());
  TrainerOptions options;
  options.max_steps = a.max_steps;
  options.default_root_dir = a.root;
  options.seed = a.seed;
  options.global_batch = a.global_batch;
  options.model_size = a.model_size;
  options.optimizer = optimizer_config(a.optimizer, a.lr > 0 ? a.lr : (a.optimizer == "sgd" ? 0.1 : 1e-3));
  options.optimizer.momentum = a.momentum;
  if (comm->rank() == 0) {
    std::printf("shardpoint-train: %d ranks (%s), model %s (%zu tensors), %lld items of 35 tokens, vocab %lld, %s, state_dict_type %s\n",
                comm->world_size(), std::string(comm->name()).c_str(), a.model_size.c_str(), param_specs(model).size(),
                static_cast<long long>(data.size()), static_cast<long long>(data.vocab_size()), a.optimizer.c_str(),
                a.state_dict_type.c_str());
    std::fflush(stdout);
  }
  Trainer trainer(options, std::move(strategy));
  const FitResult r = trainer.fit(*comm, model, data, a.ckpt_path);
  if (comm->rank() == 0) {
    std::printf("checkpoint %s (%llu bytes from rank 0), save %.3f s\n", r.checkpoint_path.c_str(),
                static_cast<unsigned long long>(r.checkpoint_bytes), r.save_seconds);
  }
  return 0;
}

}  // namespace
}  // namespace shardpoint::train

int main(int argc, char** argv) {
  try {
    return shardpoint::train::try_main(argc, argv);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "shardpoint-train: %s%s\n", rank ? fmt::format("rank {}: ", rank).c_str() : "", e.what());
    return 2;
  }
}
