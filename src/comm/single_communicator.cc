#include "shardpoint/single_communicator.h"

namespace shardpoint::comm {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(CommOptions options) : Communicator(options) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view name() const override { return "single"; }

 protected:
  void do_barrier(Timeout) override {}
  std::string do_broadcast(std::string bytes, int, Timeout) override { return bytes; }
  std::vector<std::string> do_gather(std::string bytes, int, Timeout) override {
    std::vector<std::string> out;
    out.push_back(std::move(bytes));
    return out;
  }
  std::vector<std::string> do_all_gather(std::string bytes, Timeout) override {
    std::vector<std::string> out;
    out.push_back(std::move(bytes));
    return out;
  }
  std::string do_scatter(std::vector<std::string> pieces, int, Timeout) override { return std::move(pieces.front()); }
  std::int64_t do_all_reduce_int(std::int64_t value, ReduceOp, Timeout) override { return value; }
  double do_all_reduce_double(double value, ReduceOp, Timeout) override { return value; }
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator(CommOptions options) {
  return std::make_unique<SingleCommunicator>(options);
}

}  // namespace shardpoint::comm
