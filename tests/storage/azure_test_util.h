// Azurite for the Azure driver tests: find it, start it on 127.0.0.1, stop it by PID.
//
// The server the tests share comes from, in order:
//   1. SHARDPOINT_AZURITE_STATE: a folder where tests/storage/azure_azurite.sh (the ctest
//      fixture) wrote "endpoint" ("http://127.0.0.1:PORT");
//   2. otherwise this process starts its own (AzuriteProcess), killed when the process exits.
// Azurite itself: SHARDPOINT_AZURITE_BIN, else the cache scripts/setup-azurite.sh fills
// (${SHARDPOINT_NPM_CACHE:-/var/cache/shardpoint/npm}/node_modules/.bin/azurite-blob).
// No Azurite: the tests skip with a message, and fail under SHARDPOINT_REQUIRE_ORACLES=1.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "storage/azure/azure_auth.h"
#include "storage/azure/azure_storage.h"

namespace shardpoint::storage::testing {

inline constexpr const char* kAzuriteAccount = "devstoreaccount1";
inline constexpr const char* kAzuriteKey =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

inline bool oracles_required() {
  const char* v = std::getenv("SHARDPOINT_REQUIRE_ORACLES");
  return v != nullptr && std::string(v) == "1";
}

inline std::string azurite_binary() {
  if (const char* v = std::getenv("SHARDPOINT_AZURITE_BIN"); v != nullptr && *v) return v;
  const char* cache = std::getenv("SHARDPOINT_NPM_CACHE");
  std::string dir = cache != nullptr && *cache ? cache : "/var/cache/shardpoint/npm";
  return dir + "/node_modules/.bin/azurite-blob";
}

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline bool port_open(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// One azurite-blob process on 127.0.0.1 with its data in `location`. stop() kills it by PID
// (SIGKILL: the tests use it to simulate a crash); start() again reuses port and data.
class AzuriteProcess {
 public:
  explicit AzuriteProcess(std::string location) : location_(std::move(location)) {}
  ~AzuriteProcess() { stop(); }
  AzuriteProcess(const AzuriteProcess&) = delete;
  AzuriteProcess& operator=(const AzuriteProcess&) = delete;

  // Starts it and waits (bounded, 60 s) until the port accepts connections. False (with
  // error() set) when the binary is missing or it does not come up.
  bool start() {
    std::string bin = azurite_binary();
    if (::access(bin.c_str(), X_OK) != 0) {
      error_ = "azurite-blob not found at " + bin + " (run scripts/setup-azurite.sh)";
      return false;
    }
    if (port_ == 0) port_ = free_port();
    std::filesystem::create_directories(location_);
    std::string log = location_ + "/azurite.log";
    std::string port = std::to_string(port_);
    pid_t pid = ::fork();
    if (pid < 0) {
      error_ = "fork failed";
      return false;
    }
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(bin.c_str(), bin.c_str(), "--blobHost", "127.0.0.1", "--blobPort", port.c_str(), "--location",
              location_.c_str(), "--skipApiVersionCheck", "--loose", "--disableTelemetry", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pid_ = pid;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      if (port_open(port_)) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "azurite-blob exited at start (see " + log + ")";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop();
    error_ = "azurite-blob did not listen on port " + port + " within 60 s (see " + log + ")";
    return false;
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& error() const { return error_; }

 private:
  std::string location_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string error_;
};

// The shared server's endpoint ("http://127.0.0.1:PORT"), or nullopt with *why set.
inline std::optional<std::string> shared_azurite(std::string* why) {
  static std::string error;
  static std::optional<std::string> endpoint = [&]() -> std::optional<std::string> {
    if (const char* state = std::getenv("SHARDPOINT_AZURITE_STATE"); state != nullptr && *state) {
      std::ifstream in(std::string(state) + "/endpoint");
      std::string e;
      if (in >> e && !e.empty()) return e;
      error = std::string("no Azurite endpoint in ") + state + "/endpoint (the azurite fixture did not start it)";
      return std::nullopt;
    }
    static std::string dir =
        (std::filesystem::temp_directory_path() / ("shardpoint-azurite-" + std::to_string(::getpid()))).string();
    static AzuriteProcess process(dir);
    if (!process.start()) {
      error = process.error();
      return std::nullopt;
    }
    std::atexit([] {
      process.stop();
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
    return process.endpoint();
  }();
  if (!endpoint && why != nullptr) *why = error;
  return endpoint;
}

// Short retries so failures return quickly.
inline azure::AzureConfig azurite_config(const std::string& endpoint) {
  azure::AzureConfig config;
  config.account = kAzuriteAccount;
  config.account_key = kAzuriteKey;
  config.blob_endpoint = endpoint + "/" + kAzuriteAccount;
  config.max_attempts = 3;
  config.backoff_base = std::chrono::milliseconds(10);
  config.backoff_max = std::chrono::milliseconds(100);
  config.connect_timeout = std::chrono::milliseconds(2000);
  return config;
}

inline std::string azurite_connection_string(const std::string& endpoint) {
  return std::string("DefaultEndpointsProtocol=http;AccountName=") + kAzuriteAccount + ";AccountKey=" + kAzuriteKey +
         ";BlobEndpoint=" + endpoint + "/" + kAzuriteAccount + ";";
}

// A new container with a random name; returns "az://<name>".
inline std::string fresh_container(const azure::AzureConfig& config) {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex mu;
  std::string name;
  {
    std::lock_guard lock(mu);
    char buf[32];
    std::snprintf(buf, sizeof buf, "t%016llx", static_cast<unsigned long long>(rng()));
    name = buf;
  }
  std::string url = "az://" + name;
  azure::create_azure_container(Location::parse(url), config);
  return url;
}

}  // namespace shardpoint::storage::testing

// Skips the test (fails under SHARDPOINT_REQUIRE_ORACLES=1) when no Azurite is available;
// otherwise defines `endpoint`.
#define SP_REQUIRE_AZURITE(endpoint)                                                                  \
  std::string endpoint;                                                                               \
  {                                                                                                   \
    std::string why_;                                                                                 \
    auto found_ = ::shardpoint::storage::testing::shared_azurite(&why_);                              \
    if (!found_) {                                                                                    \
      if (::shardpoint::storage::testing::oracles_required()) FAIL() << "Azurite required: " << why_; \
      GTEST_SKIP() << "Azurite unavailable: " << why_;                                                \
    }                                                                                                 \
    endpoint = *found_;                                                                               \
  }
