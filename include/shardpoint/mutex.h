// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis
// (-Wthread-safety) understands, and the annotations that name what a mutex guards.
//
//   class Queue {
//    public:
//     void push(int v) SP_EXCLUDES(mu_) { MutexLock lock(mu_); items_.push_back(v); more_.notify_one(); }
//    private:
//     int pop_locked() SP_REQUIRES(mu_);
//     Mutex mu_;
//     CondVar more_;
//     std::deque<int> items_ SP_GUARDED_BY(mu_);
//   };
//
// Clang checks at compile time that every read and write of a SP_GUARDED_BY member happens with
// its mutex held, and that SP_REQUIRES functions are called with it held (the clang builds
// and scripts/tidy_tree.py run with -Wthread-safety, as errors). Other compilers see plain
// std::mutex code: the annotations expand to nothing. A public header holds one of these where
// a public class shares state between threads.
//
// A lambda that reads guarded members while its caller holds the mutex (a wait predicate)
// says so: [&]() SP_REQUIRES(mu_) { return !items_.empty(); }.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>

#if defined(__clang__)
#define SP_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SP_THREAD_ANNOTATION(x)
#endif

// On a class: it is a lock (a "capability") the analysis tracks.
#define SP_CAPABILITY(name) SP_THREAD_ANNOTATION(capability(name))
// On a class: an RAII object that holds a lock from construction to destruction.
#define SP_SCOPED_CAPABILITY SP_THREAD_ANNOTATION(scoped_lockable)
// On a member: read or written only with the named mutex held.
#define SP_GUARDED_BY(mu) SP_THREAD_ANNOTATION(guarded_by(mu))
// On a pointer member: what it points to is read or written only with the mutex held.
#define SP_PT_GUARDED_BY(mu) SP_THREAD_ANNOTATION(pt_guarded_by(mu))
// On a function: callers hold these mutexes.
#define SP_REQUIRES(...) SP_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: callers do not hold these mutexes (it takes them itself).
#define SP_EXCLUDES(...) SP_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: it takes / releases the mutex (no argument: the object itself).
#define SP_ACQUIRE(...) SP_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define SP_RELEASE(...) SP_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define SP_TRY_ACQUIRE(...) SP_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// On a function: its body is not checked (say why beside it).
#define SP_NO_THREAD_SAFETY_ANALYSIS SP_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace shardpoint {

// std::mutex with annotations. Not recursive; lock() blocks, unlock() must be called by the
// thread that locked. Satisfies Lockable, so std::condition_variable_any and std::scoped_lock
// accept it (the analysis then does not see the lock: prefer MutexLock).
class SP_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() SP_ACQUIRE() { mu_.lock(); }
  void unlock() SP_RELEASE() { mu_.unlock(); }
  bool try_lock() SP_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` from construction to destruction, or until unlock(); lock() takes it again.
class SP_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) SP_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  // Takes over `mu`, already locked by this thread (after a successful try_lock()).
  MutexLock(Mutex& mu, std::adopt_lock_t) SP_REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() SP_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases early (for work done outside the lock) / takes the mutex again.
  void unlock() SP_RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void lock() SP_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable waited on with a Mutex held; the waits release it while they sleep and
// hold it again when they return. Waits may wake spuriously: callers loop on their condition,
// or pass it as `ready` (annotated SP_REQUIRES(mu) when it reads guarded members).
// notify_* may be called with or without the mutex held. Thread-safe.
class CondVar {
 public:
  void wait(Mutex& mu) SP_REQUIRES(mu) { cv_.wait(mu); }
  template <class Ready>
  void wait(Mutex& mu, Ready ready) SP_REQUIRES(mu) {
    cv_.wait(mu, std::move(ready));
  }
  // Returns ready() at the deadline, or true once ready() holds before it.
  template <class Clock, class Duration, class Ready>
  bool wait_until(Mutex& mu, std::chrono::time_point<Clock, Duration> deadline, Ready ready) SP_REQUIRES(mu) {
    return cv_.wait_until(mu, deadline, std::move(ready));
  }
  template <class Rep, class Period, class Ready>
  bool wait_for(Mutex& mu, std::chrono::duration<Rep, Period> timeout, Ready ready) SP_REQUIRES(mu) {
    return cv_.wait_for(mu, timeout, std::move(ready));
  }
  // Also returns (with ready()'s value) when `stop` is requested.
  template <class Ready>
  bool wait(Mutex& mu, std::stop_token stop, Ready ready) SP_REQUIRES(mu) {
    return cv_.wait(mu, std::move(stop), std::move(ready));
  }
  template <class Clock, class Duration, class Ready>
  bool wait_until(Mutex& mu, std::stop_token stop, std::chrono::time_point<Clock, Duration> deadline, Ready ready)
      SP_REQUIRES(mu) {
    return cv_.wait_until(mu, std::move(stop), deadline, std::move(ready));
  }

  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace shardpoint
