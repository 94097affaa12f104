// shardpoint-train: trains the demo Transformer language model with FSDPStrategy and writes
// Lightning-layout checkpoints (see --help, printed by kUsage below).
//
// With --devices N > 1 and no RANK/WORLD_SIZE in the environment it starts N copies of itself
// as ranks 0..N-1 (comm/launch.h: torchrun's variables, MASTER_ADDR 127.0.0.1 and a reserved
// free port) and waits for them; under a launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or mpirun) it joins, and
// an explicit --devices must then equal the launcher's world size.
// Rank 0 prints one line per step (step, epoch, loss, tokens/s) and the time of each checkpoint.
// Exit codes: 0 ok, 2 usage or run error: one "shardpoint-train: " line on stderr, from rank 0
// for a failure the ranks share (comm::is_shared_error), else from each rank that failed.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "comm/launch.h"
#include "comm/shared_error.h"
#include "shardpoint/communicator_from_env.h"
#include "shardpoint/error.h"
#include "train/trainer.h"

namespace shardpoint::train {
namespace {

#ifndef SP_DEFAULT_DATA_DIR
#define SP_DEFAULT_DATA_DIR "data/tiny-wikitext"
#endif

constexpr const char* kUsage = R"(usage: shardpoint-train [options]
Trains the demo Transformer LM (Lightning's LightningTransformer) with FSDP on CPU ranks and
writes checkpoints where and as Lightning does:
  <root>/lightning_logs/version_<k>/checkpoints/epoch=<e>-step=<s>.ckpt
(a DCP folder + meta.pt when sharded, one torch.save file when full).

run:
  --devices N              ranks to start (default 1); under torchrun-style variables
                           (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or mpirun it joins
                           that launch instead, and N must match its world size
  --strategy fsdp          the only strategy
  --state-dict-type T      full (Lightning's default: one file gathered on rank 0) or sharded
  --root DIR|URL           default_root_dir (default "."); s3://, gs://, az:// URLs work
  --ckpt-path PATH|URL|last
                           resume from a checkpoint (either format, any world size); "last":
                           the newest committed checkpoint under <root>/lightning_logs:
                           the newest last*.ckpt (--save-last), or, when its save did not
                           finish, the newest committed one (said in one line); none:
                           starts from scratch
  --seed N                 parameter init and dropout seed (default 0)
  --data DIR               WikiText-2-format folder with train.txt (default: shipped tiny corpus)
  --model-size S           tiny | demo (Lightning's demo dimensions) | 1b-shape

loop (training stops at whichever limit comes first):
  --max-steps S            optimizer steps in all (-1: no limit; default 3 unless
                           --max-epochs is given)
  --max-epochs E           epochs in all (-1: no limit); an epoch is one pass over the data:
                           ceil(items / global batch) batches
  --global-batch B         items (35-token blocks) per batch, all ranks together (default 4)
  --accumulate-grad-batches K
                           batches per optimizer step; gradients add up, each batch's loss
                           is divided by K (Lightning's rule); default 1
  --gradient-clip-val X    clip the global gradient 2-norm to X before each step (0: off)
  --optimizer O            sgd (default, lr 0.1) | adam | adamw (lr 1e-3)
  --lr X, --momentum M     learning rate; SGD momentum

checkpoints (Lightning's ModelCheckpoint):
  --every-n-train-steps N  save every N optimizer steps (then not at epoch ends)
  --every-n-epochs N       save at the end of every N-th epoch (default 1, Lightning's
                           default; a run stopped by --max-steps ends its epoch there)
  --save-top-k K           keep the K best (-1: all, 0: none); without --monitor only -1, 0,
                           1 (default 1: each new checkpoint replaces the previous one)
  --monitor train_loss     rank checkpoints by the step's training loss: the mean token NLL
                           of the step over all ranks (and accumulated batches)
  --mode min|max           which scores are better (default min)
  --save-last              also save last.ckpt at every save point (the previous one goes)
  --async-save             sharded checkpoints only (ignored for --state-dict-type full):
                           training stalls only to plan and copy this rank's bytes into
                           staging memory; the files are written in the background and the
                           checkpoint is committed (meta.pt written) at the next save or at
                           the end of the run
  Old checkpoints are removed (a whole folder when sharded) only after the new one is
  committed; checkpoints outside this run's folder are never removed.
)";

struct Args {
  int devices = 1;
  bool devices_given = false;
  std::string strategy = "fsdp";
  std::string state_dict_type = "full";
  std::int64_t max_steps = 3;
  bool max_steps_given = false;
  std::int64_t max_epochs = -1;
  std::int64_t accumulate_grad_batches = 1;
  double gradient_clip_val = 0;
  ModelCheckpointOptions checkpoint;
  bool async_save = false;
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
    auto real = [&](const std::string& v) -> double {
      try {
        std::size_t used = 0;
        const double x = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        return x;
      } catch (const std::exception&) {
        throw UsageError(fmt::format("{}: \"{}\" is not a number", k, v));
      }
    };
    if (k == "--devices") {
      a.devices = static_cast<int>(number(value()));
      a.devices_given = true;
    } else if (k == "--max-steps") {
      a.max_steps = number(value());
      a.max_steps_given = true;
    } else if (k == "--max-epochs") a.max_epochs = number(value());
    else if (k == "--accumulate-grad-batches") a.accumulate_grad_batches = number(value());
    else if (k == "--gradient-clip-val") a.gradient_clip_val = real(value());
    else if (k == "--every-n-train-steps") a.checkpoint.every_n_train_steps = number(value());
    else if (k == "--every-n-epochs") a.checkpoint.every_n_epochs = number(value());
    else if (k == "--save-top-k") a.checkpoint.save_top_k = number(value());
    else if (k == "--save-last") a.checkpoint.save_last = true;
    else if (k == "--async-save") a.async_save = true;
    else if (k == "--monitor") a.checkpoint.monitor = value();
    else if (k == "--mode") a.checkpoint.mode = value();
    else if (k == "--strategy") a.strategy = value();
    else if (k == "--state-dict-type") a.state_dict_type = value();
    else if (k == "--root") a.root = value();
    else if (k == "--ckpt-path") a.ckpt_path = value();
    else if (k == "--data") a.data = value();
    else if (k == "--optimizer") a.optimizer = value();
    else if (k == "--model-size") a.model_size = value();
    else if (k == "--lr") a.lr = real(value());
    else if (k == "--momentum") a.momentum = real(value());
    else if (k == "--seed") a.seed = static_cast<std::uint64_t>(number(value()));
    else if (k == "--global-batch") a.global_batch = number(value());
    else if (k == "-h" || k == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw UsageError(fmt::format("unknown argument \"{}\"", k));
    }
  }
  if (a.strategy != "fsdp") throw UsageError(fmt::format("unknown strategy \"{}\" (expected fsdp)", a.strategy));
  if (a.devices < 1) throw UsageError("--devices must be >= 1");
  if (a.max_steps < -1) throw UsageError("--max-steps must be >= 0, or -1 (no limit)");
  if (a.max_epochs < -1) throw UsageError("--max-epochs must be >= 0, or -1 (no limit)");
  if (a.max_epochs >= 0 && !a.max_steps_given) a.max_steps = -1;  // Lightning's default
  if (a.accumulate_grad_batches < 1) throw UsageError("--accumulate-grad-batches must be >= 1");
  if (a.gradient_clip_val < 0) throw UsageError("--gradient-clip-val must be >= 0");
  ModelCheckpoint check(a.checkpoint);  // Lightning's configuration errors, before any rank starts
  if (a.global_batch < 1) throw UsageError("--global-batch must be >= 1");
  if (a.momentum != 0 && a.optimizer != "sgd") throw UsageError("--momentum applies to --optimizer sgd only");
  return a;
}

// Starts `devices` copies of this program as ranks (comm/launch.h: torchrun's variables, a
// reserved MASTER_PORT; output and Ctrl-C shared with this process) and returns the worst
// exit code (2 for a rank killed by a signal).
int spawn_ranks(int devices, int argc, char** argv) {
  comm::LaunchOptions options;
  options.capture_output = false;
  std::vector<std::string> rank_argv(argv, argv + argc);
  rank_argv[0] = std::filesystem::read_symlink("/proc/self/exe").string();  // this very binary
  const std::vector<comm::ProcessResult> ranks = comm::launch_ranks(rank_argv, devices, options);
  int worst = 0;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::string_view why = ranks[r].output;  // only set when run_processes could not start it
    if (!why.empty()) throw Error(fmt::format("rank {}: {}", r, why.substr(0, why.find_last_not_of('\n') + 1)));
    worst = std::max(worst, ranks[r].exit_code >= 0 ? ranks[r].exit_code : 2);
  }
  return worst;
}

int try_main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  FSDPStrategy strategy(parse_state_dict_type(a.state_dict_type));  // validates before any rank starts
  if (a.devices > 1 && std::getenv("RANK") == nullptr && !comm::launched_by_mpirun()) {
    return spawn_ranks(a.devices, argc, argv);
  }
  at::set_num_threads(1);  // ranks share the cores
  auto comm = comm::make_communicator_from_env(comm::CommOptions{std::chrono::seconds(120)});
  if (a.devices_given && a.devices != comm->world_size()) {
    throw UsageError(
        fmt::format("--devices {} does not match the launcher's world size {}", a.devices, comm->world_size()));
  }
  const TextCorpus data = TextCorpus::load(a.data);
  ModelConfig model = model_config(a.model_size);
  model.vocab_size =
      a.model_size == "tiny" ? data.vocab_size() : std::max<std::int64_t>(model.vocab_size, data.vocab_size());
  TrainerOptions options;
  options.max_steps = a.max_steps;
  options.max_epochs = a.max_epochs;
  options.accumulate_grad_batches = a.accumulate_grad_batches;
  options.gradient_clip_val = a.gradient_clip_val;
  options.checkpoint = a.checkpoint;
  options.async_save = a.async_save;
  options.default_root_dir = Location::parse(a.root);
  options.seed = a.seed;
  options.global_batch = a.global_batch;
  options.model_size = a.model_size;
  options.optimizer = optimizer_config(a.optimizer, a.lr > 0 ? a.lr : (a.optimizer == "sgd" ? 0.1 : 1e-3));
  options.optimizer.momentum = a.momentum;
  if (comm->rank() == 0) {
    std::printf("shardpoint-train: %d ranks (%s), model %s (%zu tensors), %lld items of 35 tokens, vocab %lld, %s, "
                "state_dict_type %s\n",
                comm->world_size(), std::string(comm->name()).c_str(), a.model_size.c_str(), param_specs(model).size(),
                static_cast<long long>(data.size()), static_cast<long long>(data.vocab_size()), a.optimizer.c_str(),
                a.state_dict_type.c_str());
    std::fflush(stdout);
  }
  Trainer trainer(options, std::move(strategy));
  const FitResult r = trainer.fit(*comm, model, data, a.ckpt_path);
  if (comm->rank() == 0) {
    if (r.checkpoint_path.empty()) std::printf("no checkpoint saved (no step was run)\n");
    else
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
    for (const char* mpi : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
      if (!rank) rank = std::getenv(mpi);
    }
    // A failure every rank raised together (a failed save, a rank's reported error) is the
    // job's: rank 0 prints it, so the job says it once.
    if (rank != nullptr && std::string_view(rank) != "0" && shardpoint::comm::is_shared_error(e)) return 2;
    std::fprintf(stderr, "shardpoint-train: %s%s\n", rank ? fmt::format("rank {}: ", rank).c_str() : "", e.what());
    return 2;
  }
}
