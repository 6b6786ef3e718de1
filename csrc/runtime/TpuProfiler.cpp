// torch.profiler's tpu activities: a Kineto activity profiler (REGISTER_PRIVATEUSE1_PROFILER).
//
// PyTorch offers no Python route to put device events into a Kineto trace, so this file is the
// one PyTorch interface it implements; every decision is Python's
// (torch_tpu.runtime.profiling):
//
// - start() / stop() call profiling.start() / profiling.stop() (which start and stop JAX's own
//   profiler session);
// - while a session records, Kineto pushes and pops the correlation id of each op the profiler
//   records on the thread that runs it; those become intervals (id, thread, start, end), the only
//   thing recorded here, because Python cannot see them;
// - processTrace() hands the intervals to profiling.activities(), which answers the activities
//   (XLA program runs on the device, compiles on the host), each with the correlation id of the
//   op that launched it; they become Kineto activities linked to that op.
//
// With no profiler active nothing here runs: Kineto calls push/pop only during a session.

#ifdef USE_KINETO

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/utils/pybind.h>

#include "PythonNames.h"

#include <c10/util/ApproximateClock.h>
#include <libkineto.h>
#include <output_base.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace torch_tpu::profiler {

namespace {

using libkineto::ActivityType;

// An op's correlation id and when it was open, on which thread (ns, c10::getTime's clock).
struct Interval {
  uint64_t id;
  int64_t thread;
  int64_t start;
  int64_t end;
};

// The intervals of the session recording now; one session records at a time.
struct Recorder {
  std::atomic<bool> recording{false};
  std::mutex mutex;
  std::vector<Interval> closed;
};

Recorder& recorder() {
  static Recorder* instance = new Recorder();  // (never destroyed: a session may outlive exit)
  return *instance;
}

struct Open {
  uint64_t id;
  int64_t start;
};
thread_local std::vector<Open> t_open;

int64_t thread_id() {
  static thread_local const int64_t id = static_cast<int64_t>(::syscall(SYS_gettid));
  return id;
}

// profiling.<name>(*args), under the GIL; what it returns (None where Python is gone).
py::object call_python(Name name, py::tuple args = py::tuple()) {
  if (!Py_IsInitialized()) {
    return py::none();
  }
  py::gil_scoped_acquire gil;
  auto module = py::module_::import(python_name_entry(name).owner);
  return module.attr(py::handle(python_name(name)))(*args);
}

// The record activities() answers, read into `activity`: (kind, name, start_ns, end_ns,
// correlation id, device, resource, metadata {key: value}).
enum Kind : int { kDevice = 0, kHost = 1 };

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(recorder().mutex);
      recorder().closed.clear();
    }
    errors_.clear();
    guarded("start", [] { call_python(Name::profiling_start); });
    recorder().recording = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    recorder().recording = false;
    guarded("stop", [] { call_python(Name::profiling_stop); });
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return errors_;
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(
      libkineto::ActivityLogger& logger,
      libkineto::getLinkedActivityCallback linked,
      int64_t /*start*/,
      int64_t /*end*/) override {
    std::vector<Interval> intervals;
    {
      std::lock_guard<std::mutex> lock(recorder().mutex);
      intervals.swap(recorder().closed);
    }
    guarded("processTrace", [&] {
      py::gil_scoped_acquire gil;
      py::list given;
      for (const auto& interval : intervals) {
        given.append(py::make_tuple(interval.id, interval.thread, interval.start, interval.end));
      }
      py::object records = call_python(Name::profiling_activities, py::make_tuple(given));
      for (auto record : records) {
        add(py::reinterpret_borrow<py::tuple>(record), linked, logger);
      }
    });
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(0, kDeviceSort, "tpu:0", "tpu 0");
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {libkineto::ResourceInfo(0, 0, 0, "XLA programs")};
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::make_unique<libkineto::CpuTraceBuffer>(std::move(buffer_));
  }

  void pushCorrelationId(uint64_t id) override {
    if (recorder().recording) {
      t_open.push_back({id, c10::getTime()});
    }
  }

  void popCorrelationId() override {
    if (t_open.empty()) {
      return;
    }
    Open open = t_open.back();
    t_open.pop_back();
    std::lock_guard<std::mutex> lock(recorder().mutex);
    recorder().closed.push_back({open.id, thread_id(), open.start, c10::getTime()});
  }

 private:
  // (the trace viewer's place of the device's row: below the host's)
  static constexpr int64_t kDeviceSort = 1 << 20;

  template <typename F>
  void guarded(const char* step, F&& step_fn) {
    try {
      step_fn();
    } catch (const std::exception& error) {
      errors_.push_back(std::string("torch_tpu profiler ") + step + ": " + error.what());
    }
  }

  void add(const py::tuple& record, const libkineto::getLinkedActivityCallback& linked,
           libkineto::ActivityLogger& logger) {
    const int kind = record[0].cast<int>();
    buffer_.emplace_activity(
        buffer_.span, kind == kDevice ? ActivityType::CONCURRENT_KERNEL : ActivityType::PRIVATEUSE1_RUNTIME,
        record[1].cast<std::string>());
    auto& activity = libkineto::CpuTraceBuffer::toRef(buffer_.activities.back());
    activity.startTime = record[2].cast<int64_t>();
    activity.endTime = record[3].cast<int64_t>();
    const auto correlation = record[4].cast<int64_t>();
    // (device events: the device's row and its program stream; host ones: the process's thread)
    activity.device = kind == kDevice ? record[5].cast<int32_t>() : static_cast<int32_t>(getpid());
    activity.resource = record[6].cast<int32_t>();
    activity.threadId = activity.resource;
    if (correlation > 0) {
      activity.id = static_cast<int32_t>(correlation);
      activity.flow.id = static_cast<uint32_t>(correlation);
      activity.flow.type = libkineto::kLinkAsyncCpuGpu;
      activity.flow.start = 0;
      if (linked) {
        activity.linked = linked(static_cast<int32_t>(correlation));
        if (activity.linked != nullptr) {  // (the trace names the op on the program's own event)
          activity.addMetadataQuoted("op", activity.linked->name());
        }
      }
    }
    for (auto item : record[7].cast<py::dict>()) {
      activity.addMetadataQuoted(item.first.cast<std::string>(), item.second.cast<std::string>());
    }
    activity.log(logger);
  }

  std::vector<std::string> errors_;
  libkineto::CpuTraceBuffer buffer_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& types,
      const libkineto::Config& /*config*/) override {
    // (device activities asked for: a session; the host ones alone come with CPU profiling)
    return types.count(ActivityType::CONCURRENT_KERNEL) ? std::make_unique<Session>() : nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/,
      int64_t /*duration_ms*/,
      const std::set<ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"tpu"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::PRIVATEUSE1_RUNTIME};
};

}  // namespace

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

}  // namespace torch_tpu::profiler

#endif  // USE_KINETO
