// The watchdog: finds operations that hang and ranks that are gone, says which, ends the job.
//
// Each tick (poll_seconds) the thread
//   0. retires the NCCL operations whose completion events the device has reached (they run on
//      a stream after their call has returned, op_tracker.hpp);
//   1. receives messages on its own communicator: heartbeats, queries (answered at once), replies;
//   2. sends a heartbeat to its successor in the ring and checks its predecessor's;
//   3. looks for the oldest operation in flight beyond the timeout; when it finds one on a
//      collective, it asks the communicator's rank 0 (the coordinator) to report, so that a hang
//      on n ranks costs O(n) messages and prints one report; the coordinator (or, if it does not
//      report in time, this rank) asks every member how far it got and prints the report;
//   4. ends the job when the report is ready or a rank is lost: ncclCommAbort on this process's
//      NCCL communicators (a NCCL kernel waiting for a late peer never returns), then MPI_Abort.
// Every MPI call here is non-blocking (MPI_Isend, MPI_Irecv, MPI_Test), so a dead peer cannot
// stall the watchdog: it is reported as not responding once its reply is overdue.
#include "mpi_layer/watchdog.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string_view>
#include <thread>
#include <type_traits>

#include "base/text.hpp"
#include "mpi_layer/mpi_check.hpp"
#include "mpi_layer/op_tracker.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/watchdog.hpp"

namespace zt {

std::string collective_timeout_problem(double seconds) {
  if (seconds == 0.0) return {};
  if (std::isfinite(seconds) && seconds >= kMinimumCollectiveTimeoutSeconds &&
      seconds <= kMaximumCollectiveTimeoutSeconds)
    return {};
  std::ostringstream text;
  if (std::isnan(seconds) || std::isinf(seconds)) {
    text << seconds << " is not a number of seconds";
  } else if (seconds < 0.0) {
    text << seconds << " s is negative";
  } else if (seconds < kMinimumCollectiveTimeoutSeconds) {
    text << seconds << " s is below the minimum of " << kMinimumCollectiveTimeoutSeconds
         << " s (a healthy job would be reported as hung)";
  } else {
    text << seconds << " s is above the maximum of " << kMaximumCollectiveTimeoutSeconds << " s";
  }
  text << "; expected 0 or \"off\" (no watchdog) or " << kMinimumCollectiveTimeoutSeconds << " to "
       << kMaximumCollectiveTimeoutSeconds << " seconds";
  return text.str();
}

namespace {
std::mutex report_listener_mutex;
WatchdogReportListener report_listener;  // guarded by report_listener_mutex
}  // namespace

void set_watchdog_report_listener(WatchdogReportListener listener) {
  const std::lock_guard lock(report_listener_mutex);
  report_listener = std::move(listener);
}
}  // namespace zt

namespace zt::detail {
namespace {
/// The report goes to the listener too (the metrics file); its failure must not stop the ending.
void notify_report_listener(const std::string& report, int exit_code) {
  WatchdogReportListener listener;
  {
    const std::lock_guard lock(report_listener_mutex);
    listener = report_listener;
  }
  if (!listener) return;
  try {
    listener(report, exit_code);
  } catch (...) {
  }
}
}  // namespace

WatchdogSettings WatchdogSettings::for_timeout(double timeout_seconds, std::string source) {
  WatchdogSettings settings;
  settings.timeout_seconds = timeout_seconds;
  if (!source.empty()) settings.source = std::move(source);
  settings.heartbeat_timeout_seconds = std::max(3.0, std::min(timeout_seconds, 60.0));
  settings.heartbeat_interval_seconds = std::min(1.0, settings.heartbeat_timeout_seconds / 5.0);
  settings.reply_wait_seconds = std::min(5.0, std::max(1.0, timeout_seconds / 2.0));
  settings.poll_seconds = std::min(0.1, settings.heartbeat_interval_seconds / 2.0);
  return settings;
}

std::optional<double> collective_timeout_from_environment() {
  const char* text = std::getenv("ZT_COLLECTIVE_TIMEOUT");
  if (text == nullptr || *text == '\0') return std::nullopt;
  if (std::string_view(text) == "off") return 0.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  ZT_CHECK_AS(ConfigError, end != text && *end == '\0', "ZT_COLLECTIVE_TIMEOUT='", text,
              "' is not a number of seconds; expected e.g. 600 or 30.5, or 0 or \"off\" to turn the watchdog "
              "off");
  const std::string problem = collective_timeout_problem(seconds);
  ZT_CHECK_AS(ConfigError, problem.empty(), "ZT_COLLECTIVE_TIMEOUT='", text, "': ", problem);
  return seconds;
}

CommIdentity agree_comm_identity(MPI_Comm comm, const std::string& name) {
  // Every member proposes the next id it has not used yet; the maximum is new to all of them.
  static std::atomic<std::uint64_t> next_unused_id{1};
  const std::uint64_t proposal = next_unused_id.load();
  std::uint64_t agreed = 0;
  ZT_CHECK_MPI(MPI_Allreduce(&proposal, &agreed, 1, MPI_UINT64_T, MPI_MAX, comm), name);
  std::uint64_t expected = next_unused_id.load();
  while (expected <= agreed && !next_unused_id.compare_exchange_weak(expected, agreed + 1)) {
  }
  CommIdentity identity{.id = agreed, .world_ranks = {}};
  int inter = 0;
  ZT_CHECK_MPI(MPI_Comm_test_inter(comm, &inter), name);
  if (inter != 0) return identity;  // members of the remote group are not ours to ask
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Group world_group = MPI_GROUP_NULL;
  ZT_CHECK_MPI(MPI_Comm_group(comm, &group), name);
  ZT_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group), name);
  int size = 0;
  MPI_Group_size(group, &size);
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  identity.world_ranks.resize(ranks.size());
  const int code =
      MPI_Group_translate_ranks(group, size, ranks.data(), world_group, identity.world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  ZT_CHECK_MPI(code, name);
  for (int& rank : identity.world_ranks) {
    if (rank == MPI_UNDEFINED) rank = -1;
  }
  return identity;
}

namespace {

using Seconds = std::chrono::duration<double>;

constexpr int kMessageTag = 1;
constexpr std::size_t kNameLength = 32;
constexpr std::size_t kMaxDetailLines = 8;
constexpr double kDrainSeconds = 10.0;          // at shutdown, wait this long at most for the last messages
constexpr double kAbortFallbackSeconds = 10.0;  // if MPI_Abort itself hangs, exit anyway
constexpr double kNoticeSeconds = 0.5;          // how long the job-ending notices may take to go out

enum class MessageKind : std::int32_t { heartbeat = 1, goodbye, query, reply, report_request, job_ending };

/// An operation as one rank sees it; op < 0 means none.
struct OpView {
  std::int32_t op = -1;
  std::int32_t dtype = -1;
  std::int32_t peer = -1;        // send/recv peer or broadcast root, rank in the communicator
  std::int32_t peer_world = -1;  // the same as a world rank, when known
  std::int32_t tag = -1;
  std::uint64_t comm_id = 0;
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;
  double seconds = 0.0;  // in flight for
  char comm_name[kNameLength] = {};

  bool present() const { return op >= 0; }
  CommOp kind() const { return static_cast<CommOp>(op); }
};

/// Every watchdog message has this one layout (sent as bytes: the ranks of a job share an ABI).
struct Message {
  MessageKind kind = MessageKind::heartbeat;
  std::int32_t detected_by = -1;  // world rank that saw `subject` hang; job_ending: the exit code
  OpView subject;                 // query, reply, report_request: the operation that hangs
  // Replies: the replying rank's progress on subject's communicator ...
  std::int32_t knows_comm = 0;
  std::uint64_t started = 0;    // collectives started
  std::uint64_t completed = 0;  // every collective up to this one completed
  OpView at_seq;                // its own collective with subject's sequence number, if in flight
  // ... and what it is doing: its oldest operation in flight on any communicator, and the other
  // half of that operation's exchange when it is one and both halves are in flight.
  OpView oldest;
  OpView oldest_other_half;
};
static_assert(std::is_trivially_copyable_v<Message>);

Message make_message(MessageKind kind, int detected_by = -1, const OpView& subject = {}) {
  Message message;
  message.kind = kind;
  message.detected_by = detected_by;
  message.subject = subject;
  return message;
}

OpView view_of(const OpRecord& record, const OpTracker& tracker, WatchdogClock::time_point now) {
  OpView view;
  view.op = static_cast<std::int32_t>(record.op);
  view.dtype = record.type ? static_cast<std::int32_t>(*record.type) : -1;
  view.peer = record.peer;
  view.peer_world = record.peer >= 0 ? tracker.world_rank_of(record.peer) : -1;
  view.tag = record.tag;
  view.comm_id = tracker.identity().id;
  view.seq = record.seq;
  view.bytes = record.bytes;
  view.seconds = Seconds(now - record.start).count();
  const std::string& name = tracker.name();
  std::memcpy(view.comm_name, name.data(), std::min(name.size(), kNameLength - 1));
  return view;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", seconds);
  return text;
}

std::string peer_text(const OpView& op) {
  if (op.peer_world >= 0) return "rank " + std::to_string(op.peer_world);
  return "rank " + std::to_string(op.peer) + " of '" + op.comm_name + "'";
}

/// "all_reduce #17", "send #3 to rank 1", "recv #2 from rank 1".
std::string operation_text(const OpView& op) {
  const CommOp kind = op.kind();
  std::string text = std::string(comm_op_name(kind)) + " #" + std::to_string(op.seq);
  if (kind == CommOp::send) text += " to " + peer_text(op);
  if (kind == CommOp::recv) text += " from " + peer_text(op);
  return text;
}

/// "(4.0 MiB fp32)", "(tag 0, 4 B int32)", "(64 B fp32, root rank 0)"; "" for a barrier.
std::string payload_text(const OpView& op) {
  const CommOp kind = op.kind();
  if (kind == CommOp::barrier) return "";
  std::ostringstream out;
  out << "(";
  if (!is_collective(kind)) out << "tag " << op.tag << ", ";
  out << base::byte_size_text(op.bytes);
  if (op.dtype >= 0) out << " " << dtype_name(static_cast<DType>(op.dtype));
  if (kind == CommOp::broadcast) out << ", root " << peer_text(op);
  out << ")";
  return out.str();
}

/// "all_reduce #17 on communicator 'data' (4.0 MiB fp32)", "recv #2 from rank 1 on communicator
/// 'world' (tag 0, 4 B int32)".
std::string describe(const OpView& op) {
  const std::string payload = payload_text(op);
  return operation_text(op) + " on communicator '" + op.comm_name + "'" +
         (payload.empty() ? "" : " " + payload);
}

/// The two halves of one exchange, the send first: "send #5 to rank 1 (tag 0, 4.0 KiB fp32) and
/// recv #6 from rank 3 (tag 0, 4.0 KiB fp32), one exchange on communicator 'pipe'".
std::string describe_exchange(const OpView& half, const OpView& other_half) {
  const bool send_first = half.kind() == CommOp::send;
  const OpView& send = send_first ? half : other_half;
  const OpView& recv = send_first ? other_half : half;
  return operation_text(send) + " " + payload_text(send) + " and " + operation_text(recv) + " " +
         payload_text(recv) + ", one exchange on communicator '" + send.comm_name + "'";
}

/// "3", "ranks 3, 5-7": world ranks, runs compressed.
std::string ranks_text(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
    if (j > i) {
      text += '-';
      text += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return text;
}

/// The other half of `record`'s exchange (Communicator::isend_irecv) if it is in flight too, else
/// none (op < 0).
OpView other_half_of(const OpRecord& record, const std::vector<OpRecord>& in_flight, const OpTracker& tracker,
                     WatchdogClock::time_point now) {
  if (record.exchange != 0) {
    for (const OpRecord& other : in_flight) {
      if (other.exchange == record.exchange && other.op != record.op) return view_of(other, tracker, now);
    }
  }
  return {};
}

/// An operation in flight, and the other half of its exchange when it is one and both wait.
struct InFlightView {
  OpView op;
  OpView other_half;
};

/// The oldest operation in flight on this rank older than `min_seconds`, on any communicator.
InFlightView oldest_in_flight(WatchdogClock::time_point now, double min_seconds = -1.0) {
  InFlightView oldest;
  for (const auto& tracker : live_trackers()) {
    const std::vector<OpRecord> in_flight = tracker->snapshot().in_flight;
    for (const OpRecord& record : in_flight) {
      const OpView view = view_of(record, *tracker, now);
      if (view.seconds > min_seconds && (!oldest.op.present() || view.seconds > oldest.op.seconds)) {
        oldest = {view, other_half_of(record, in_flight, *tracker, now)};
      }
    }
  }
  return oldest;
}

}  // namespace

class Watchdog::Loop {
 public:
  Loop(WatchdogSettings settings, std::vector<std::string> host_of_rank)
      : settings_(settings), hosts_(std::move(host_of_rank)) {
    ZT_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "world");
    ZT_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "world");
    ZT_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "watchdog");
    ZT_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "watchdog");
    MPI_Comm_set_name(comm_, "zerotrain watchdog");
    successor_ = (world_rank_ + 1) % world_size_;
    predecessor_ = (world_rank_ + world_size_ - 1) % world_size_;
    thread_ = std::thread([this] { run(); });
  }

  ~Loop() {
    {
      const std::lock_guard lock(mutex_);
      stop_requested_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized == 0) MPI_Comm_free(&comm_);
  }

  void begin_shutdown() {
    {
      const std::lock_guard lock(mutex_);
      shutdown_requested_ = true;
    }
    wake_.notify_all();
  }

  const WatchdogSettings& settings() const { return settings_; }

 private:
  struct Outgoing {
    std::unique_ptr<Message> message;  // MPI reads it until the send completes
    MPI_Request request = MPI_REQUEST_NULL;
    int peer = -1;
  };

  /// A hang being looked into: whom we asked and what they answered.
  struct Investigation {
    OpView subject;
    OpView other_half;  // when subject is half of an exchange whose halves both wait
    int detected_by = -1;
    std::vector<int> asked;                       // world ranks; for a collective, every member
    std::vector<std::optional<Message>> replies;  // by position in `asked`
    WatchdogClock::time_point deadline;
    bool delegated = false;  // the coordinator was asked to report; until `deadline`, we wait
  };

  void run() noexcept {
    try {
      post_receive();
      const auto start = WatchdogClock::now();
      last_heard_from_predecessor_ = start;
      next_heartbeat_ = start;
      std::unique_lock lock(mutex_);
      while (!stop_requested_) {
        const bool shutting_down = shutdown_requested_;
        lock.unlock();
        tick(WatchdogClock::now(), shutting_down);
        lock.lock();
        wake_.wait_for(lock, Seconds(settings_.poll_seconds),
                       [&] { return stop_requested_ || shutdown_requested_ != shutting_down; });
      }
      const bool clean = shutdown_requested_;
      lock.unlock();
      drain(clean);
    } catch (const std::exception& error) {
      // The watchdog is a diagnostic: if it breaks, say so loudly but let the job run on.
      std::fprintf(stderr, "zerotrain watchdog on rank %d stopped: %s; hangs will not be detected\n",
                   world_rank_, error.what());
    }
  }

  void tick(WatchdogClock::time_point now, bool shutting_down) {
    // Operations that completed on a device (NCCL) since the last tick are no longer in flight.
    retire_device_work_everywhere();
    receive_messages(now);
    progress_sends(shutting_down);
    if (world_size_ > 1) {
      if (!shutting_down) {
        send_heartbeat(now);
        check_predecessor(now);
      } else if (!goodbye_sent_) {
        send(successor_, make_message(MessageKind::goodbye));
        goodbye_sent_ = true;
      }
    }
    if (!investigation_) look_for_hangs(now);
    if (investigation_) advance_investigation(now);
  }

  // ---- messages ---------------------------------------------------------------------------

  void post_receive() {
    ZT_CHECK_MPI(
        MPI_Irecv(&incoming_, sizeof(Message), MPI_BYTE, MPI_ANY_SOURCE, kMessageTag, comm_, &receive_),
        "watchdog");
  }

  void receive_messages(WatchdogClock::time_point now) {
    while (true) {
      int done = 0;
      MPI_Status status;
      ZT_CHECK_MPI(MPI_Test(&receive_, &done, &status), "watchdog");
      if (done == 0) return;
      const Message message = incoming_;
      post_receive();
      handle(message, status.MPI_SOURCE, now);
    }
  }

  void handle(const Message& message, int source, WatchdogClock::time_point now) {
    switch (message.kind) {
      case MessageKind::heartbeat:
        if (source == predecessor_) last_heard_from_predecessor_ = now;
        break;
      case MessageKind::goodbye:
        if (source == predecessor_) predecessor_left_ = true;
        break;
      case MessageKind::query:
        send(source, reply_to(message.subject, now));
        break;
      case MessageKind::reply:
        record_reply(message, source);
        break;
      case MessageKind::job_ending:
        // Another rank is ending the job. MPI_Abort normally takes every rank down, but a
        // launcher that tolerates failures (mpirun --enable-recovery) ends only the caller.
        end_job("", message.detected_by);
      case MessageKind::report_request:
        // We coordinate this communicator: report for everyone, unless we are on another case.
        if (!investigation_ || investigation_->delegated) {
          investigation_.reset();
          start_investigation(message.subject, message.detected_by, /*coordinator=*/true, now);
        }
        break;
    }
  }

  void send(int peer, const Message& message) {
    Outgoing& out = outgoing_.emplace_back();
    out.message = std::make_unique<Message>(message);
    out.peer = peer;
    const int code =
        MPI_Isend(out.message.get(), sizeof(Message), MPI_BYTE, peer, kMessageTag, comm_, &out.request);
    if (code != MPI_SUCCESS) {
      outgoing_.pop_back();
      lost_contact(peer, code);
    }
  }

  void progress_sends(bool shutting_down) {
    std::erase_if(outgoing_, [&](Outgoing& out) {
      int done = 0;
      const int code = MPI_Test(&out.request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS && !shutting_down) lost_contact(out.peer, code);
      return done != 0 || code != MPI_SUCCESS;
    });
  }

  // ---- heartbeats ---------------------------------------------------------------------------

  void send_heartbeat(WatchdogClock::time_point now) {
    if (now < next_heartbeat_) return;
    send(successor_, make_message(MessageKind::heartbeat));
    next_heartbeat_ = now + std::chrono::duration_cast<WatchdogClock::duration>(
                                Seconds(settings_.heartbeat_interval_seconds));
  }

  void check_predecessor(WatchdogClock::time_point now) {
    if (predecessor_left_) return;
    const double silent = Seconds(now - last_heard_from_predecessor_).count();
    if (silent <= settings_.heartbeat_timeout_seconds) return;
    std::ostringstream out;
    out << "zerotrain watchdog: rank " << predecessor_ << host_text(predecessor_)
        << " has sent no heartbeat for " << seconds_text(silent) << " s (one is due every "
        << seconds_text(settings_.heartbeat_interval_seconds) << " s) to rank " << world_rank_
        << "; it has died (killed, crashed, out of memory, node failure) or is frozen (stopped, in a "
           "debugger)\n";
    append_local_state(out, now);
    out << ending_text(kWatchdogRankLostExitCode);
    end_job(out.str(), kWatchdogRankLostExitCode);
  }

  void lost_contact(int peer, int code) {
    std::ostringstream out;
    out << "zerotrain watchdog: rank " << world_rank_ << " cannot reach rank " << peer << host_text(peer)
        << ": " << mpi_error_string(code) << "; it has presumably died\n";
    append_local_state(out, WatchdogClock::now());
    out << ending_text(kWatchdogRankLostExitCode);
    end_job(out.str(), kWatchdogRankLostExitCode);
  }

  // ---- hangs --------------------------------------------------------------------------------

  void look_for_hangs(WatchdogClock::time_point now) {
    const InFlightView oldest = oldest_in_flight(now, settings_.timeout_seconds);
    if (oldest.op.present())
      start_investigation(oldest.op, world_rank_, /*coordinator=*/false, now, oldest.other_half);
  }

  void start_investigation(const OpView& subject, int detected_by, bool coordinator,
                           WatchdogClock::time_point now, const OpView& other_half = {}) {
    Investigation& case_ = investigation_.emplace();
    case_.subject = subject;
    case_.other_half = other_half;
    case_.detected_by = detected_by;
    const std::shared_ptr<OpTracker> tracker = find_tracker(subject.comm_id);
    if (tracker == nullptr || tracker->identity().world_ranks.empty()) {
      case_.deadline = now;  // nobody to ask: report what we know
      return;
    }
    if (!is_collective(subject.kind())) {
      // A point-to-point operation: its peer, and for an exchange the other half's peer too.
      for (const OpView* half : {&subject, &other_half}) {
        if (half->present() && half->peer_world >= 0 &&
            std::find(case_.asked.begin(), case_.asked.end(), half->peer_world) == case_.asked.end()) {
          case_.asked.push_back(half->peer_world);
        }
      }
    } else {
      case_.asked = tracker->identity().world_ranks;
      const int coordinator_rank = case_.asked.front();
      if (!coordinator && coordinator_rank != world_rank_) {
        // One report from the coordinator with O(n) messages, rather than n reports of n queries.
        send(coordinator_rank, make_message(MessageKind::report_request, detected_by, subject));
        case_.delegated = true;
        case_.deadline = now + to_duration(settings_.reply_wait_seconds + 2.0 + 2.0 * settings_.poll_seconds);
        return;
      }
    }
    ask(case_, now);
  }

  void ask(Investigation& case_, WatchdogClock::time_point now) {
    case_.replies.assign(case_.asked.size(), std::nullopt);
    for (std::size_t i = 0; i < case_.asked.size(); ++i) {
      if (case_.asked[i] == world_rank_) {
        case_.replies[i] = reply_to(case_.subject, now);
      } else if (case_.asked[i] >= 0) {
        send(case_.asked[i], make_message(MessageKind::query, case_.detected_by, case_.subject));
      }
    }
    case_.deadline = now + to_duration(settings_.reply_wait_seconds);
  }

  void record_reply(const Message& reply, int source) {
    if (!investigation_ || investigation_->delegated) return;
    Investigation& case_ = *investigation_;
    if (reply.subject.comm_id != case_.subject.comm_id || reply.subject.seq != case_.subject.seq ||
        reply.subject.op != case_.subject.op) {
      return;  // an answer to an earlier question
    }
    for (std::size_t i = 0; i < case_.asked.size(); ++i) {
      if (case_.asked[i] == source) case_.replies[i] = reply;
    }
  }

  void advance_investigation(WatchdogClock::time_point now) {
    Investigation& case_ = *investigation_;
    if (case_.delegated) {
      if (now < case_.deadline) return;
      case_.delegated = false;  // the coordinator did not end the job: report ourselves
      ask(case_, now);
      return;
    }
    const bool everyone_answered = std::all_of(case_.replies.begin(), case_.replies.end(),
                                               [](const auto& reply) { return reply.has_value(); });
    if (!everyone_answered && now < case_.deadline) return;
    end_job(report(case_, now), kWatchdogTimeoutExitCode);
  }

  /// What this rank knows about `subject`'s communicator and what it is doing.
  Message reply_to(const OpView& subject, WatchdogClock::time_point now) const {
    Message reply = make_message(MessageKind::reply, -1, subject);
    if (const auto tracker = find_tracker(subject.comm_id)) {
      const OpTracker::Snapshot snapshot = tracker->snapshot();
      reply.knows_comm = 1;
      reply.started = snapshot.collectives_started;
      reply.completed = snapshot.collectives_completed;
      if (is_collective(subject.kind())) {
        for (const OpRecord& record : snapshot.in_flight) {
          if (is_collective(record.op) && record.seq == subject.seq)
            reply.at_seq = view_of(record, *tracker, now);
        }
      }
    }
    const InFlightView oldest = oldest_in_flight(now);
    reply.oldest = oldest.op;
    reply.oldest_other_half = oldest.other_half;
    return reply;
  }

  // ---- reports ------------------------------------------------------------------------------

  std::string report(const Investigation& case_, WatchdogClock::time_point now) const {
    const OpView& subject = case_.subject;
    std::ostringstream out;
    out << "zerotrain watchdog: "
        << (case_.other_half.present() ? describe_exchange(subject, case_.other_half) + ","
                                       : describe(subject))
        << " has not completed after " << seconds_text(subject.seconds) << " s on rank " << case_.detected_by;
    if (case_.detected_by != world_rank_) out << " (reported by rank " << world_rank_ << ")";

    std::vector<std::string> findings;
    std::vector<std::pair<int, const Message*>> details;  // ranks worth a line of their own
    if (case_.asked.empty()) {
      findings.push_back("the other ranks cannot be asked (the communicator has no identity)");
    } else if (!is_collective(subject.kind())) {
      if (case_.other_half.present()) {
        findings.push_back(
            "both halves are in flight (one isend_irecv; on NCCL one group, which ends only when both peers "
            "have taken part)");
      }
      for (std::size_t i = 0; i < case_.asked.size(); ++i) {
        if (!case_.replies[i]) {
          findings.push_back("rank " + std::to_string(case_.asked[i]) +
                             " not responding (dead, or its watchdog is blocked)");
        } else {
          details.emplace_back(case_.asked[i], &*case_.replies[i]);
        }
      }
    } else {
      std::map<std::uint64_t, std::vector<int>> not_arrived;  // by last completed collective
      std::vector<int> not_responding;
      std::vector<int> unknown_comm;
      std::vector<int> waiting;
      for (std::size_t i = 0; i < case_.asked.size(); ++i) {
        const int rank = case_.asked[i];
        const auto& reply = case_.replies[i];
        if (!reply) {
          not_responding.push_back(rank);
        } else if (reply->knows_comm == 0) {
          unknown_comm.push_back(rank);
        } else if (reply->started < subject.seq) {
          not_arrived[reply->completed].push_back(rank);
          details.emplace_back(rank, &*reply);
        } else if (reply->at_seq.present() &&
                   (reply->at_seq.op != subject.op || reply->at_seq.bytes != subject.bytes)) {
          findings.push_back("rank " + std::to_string(rank) + " entered #" + std::to_string(subject.seq) +
                             " as " + describe(reply->at_seq) + ": mismatched collectives");
        } else if (reply->completed < subject.seq) {
          waiting.push_back(rank);
        }
      }
      if (!not_arrived.empty()) {
        std::string text = "not arrived: ";
        bool first = true;
        for (const auto& [completed, ranks] : not_arrived) {
          text += (first ? "" : "; ") + ranks_text(ranks) + " (last completed #" + std::to_string(completed) +
                  ")";
          first = false;
        }
        findings.insert(findings.begin(), text);
      }
      if (!not_responding.empty()) {
        findings.push_back(ranks_text(not_responding) + " not responding (dead, or the watchdog is blocked)");
      }
      if (!unknown_comm.empty()) {
        findings.push_back(ranks_text(unknown_comm) + " no longer " +
                           (unknown_comm.size() == 1 ? "has" : "have") + " this communicator");
      }
      if (findings.empty()) {
        findings.push_back(
            "every rank has entered it, so the operation itself is stuck (MPI, NCCL or network)");
      } else if (!waiting.empty()) {
        findings.push_back("waiting in it: " + ranks_text(waiting));
      }
    }
    for (const std::string& finding : findings) out << "; " << finding;
    out << "\n";
    for (std::size_t i = 0; i < details.size() && i < kMaxDetailLines; ++i) {
      const auto& [rank, reply] = details[i];
      out << "zerotrain watchdog:   rank " << rank << host_text(rank) << ": "
          << activity_text({reply->oldest, reply->oldest_other_half}) << "\n";
    }
    if (details.size() > kMaxDetailLines) {
      out << "zerotrain watchdog:   (" << details.size() - kMaxDetailLines << " more ranks)\n";
    }
    if (case_.detected_by == world_rank_ || case_.asked.empty()) append_local_state(out, now);
    out << ending_text(kWatchdogTimeoutExitCode);
    return out.str();
  }

  static std::string activity_text(const InFlightView& oldest) {
    if (!oldest.op.present()) return "in no zerotrain operation (computing, or blocked outside zerotrain)";
    if (oldest.other_half.present()) {
      return "in " + describe_exchange(oldest.op, oldest.other_half) + ", for " +
             seconds_text(oldest.op.seconds) + " s";
    }
    return "in " + describe(oldest.op) + " for " + seconds_text(oldest.op.seconds) + " s";
  }

  void append_local_state(std::ostringstream& out, WatchdogClock::time_point now) const {
    out << "zerotrain watchdog:   rank " << world_rank_ << host_text(world_rank_, ", this rank") << ": "
        << activity_text(oldest_in_flight(now)) << "\n";
  }

  /// " (host)" or " (host, note)".
  std::string host_text(int rank, std::string_view note = {}) const {
    if (rank < 0 || static_cast<std::size_t>(rank) >= hosts_.size()) return "";
    return " (" + hosts_[static_cast<std::size_t>(rank)] + std::string(note) + ")";
  }

  std::string ending_text(int exit_code) const {
    const std::string limit = exit_code == kWatchdogTimeoutExitCode
                                  ? "collective timeout " + seconds_text(settings_.timeout_seconds) + " s"
                                  : "heartbeat timeout " + seconds_text(settings_.heartbeat_timeout_seconds) +
                                        " s = min(collective timeout, 60 s)";
    return "zerotrain watchdog: ending the job with exit code " + std::to_string(exit_code) + " (" + limit +
           "; the collective timeout comes from " + settings_.source +
           "; ZT_COLLECTIVE_TIMEOUT overrides comm.timeout_s and RuntimeOptions::collective_timeout, 0 or "
           "\"off\" turns the watchdog off)\n";
  }

  /// Print the report, tell every rank, then MPI_Abort. The notices matter where MPI_Abort ends
  /// only this process; if MPI_Abort cannot reach the launcher at all, exit anyway.
  [[noreturn]] void end_job(const std::string& report, int exit_code) {
    std::fputs(report.c_str(), stderr);
    std::fflush(stderr);
    if (!report.empty()) notify_report_listener(report, exit_code);
    std::thread([exit_code] {
      std::this_thread::sleep_for(Seconds(kAbortFallbackSeconds));
      std::_Exit(exit_code);
    }).detach();
    if (!report.empty()) {
      for (int rank = 0; rank < world_size_; ++rank) {
        if (rank == world_rank_) continue;
        Outgoing& out = outgoing_.emplace_back();
        out.message = std::make_unique<Message>(make_message(MessageKind::job_ending, exit_code));
        MPI_Isend(out.message.get(), sizeof(Message), MPI_BYTE, rank, kMessageTag, comm_, &out.request);
      }
      const auto give_up = WatchdogClock::now() + to_duration(kNoticeSeconds);
      while (WatchdogClock::now() < give_up &&
             std::any_of(outgoing_.begin(), outgoing_.end(), [](Outgoing& out) {
               int done = 0;
               return MPI_Test(&out.request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done == 0;
             })) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    // A NCCL kernel that waits for a peer never returns by itself: abort the device communicators
    // (ncclCommAbort), so that their streams end and nothing keeps the GPU busy after the job.
    abort_device_work_everywhere();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

  // ---- shutdown -----------------------------------------------------------------------------

  /// After a clean shutdown (begin_shutdown on every rank, then a barrier), the predecessor's
  /// goodbye is the last message to arrive and our sends are the last ones out; wait for both,
  /// within bounds, so that the communicator is freed with nothing in flight.
  void drain(bool clean) {
    const auto give_up = WatchdogClock::now() + to_duration(kDrainSeconds);
    while (clean && world_size_ > 1 && WatchdogClock::now() < give_up &&
           (!predecessor_left_ || !outgoing_.empty())) {
      if (!goodbye_sent_) {
        send(successor_, make_message(MessageKind::goodbye));
        goodbye_sent_ = true;
      }
      receive_messages(WatchdogClock::now());
      progress_sends(/*shutting_down=*/true);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MPI_Cancel(&receive_);
    MPI_Wait(&receive_, MPI_STATUS_IGNORE);
    for (Outgoing& out : outgoing_) MPI_Request_free(&out.request);  // completes on its own
    outgoing_.clear();
  }

  static WatchdogClock::duration to_duration(double seconds) {
    return std::chrono::duration_cast<WatchdogClock::duration>(Seconds(seconds));
  }

  const WatchdogSettings settings_;
  const std::vector<std::string> hosts_;
  int world_rank_ = 0;
  int world_size_ = 1;
  int successor_ = 0;
  int predecessor_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
  bool shutdown_requested_ = false;
  std::thread thread_;

  // Used by the thread only.
  Message incoming_;
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::vector<Outgoing> outgoing_;
  WatchdogClock::time_point last_heard_from_predecessor_;
  WatchdogClock::time_point next_heartbeat_;
  bool predecessor_left_ = false;
  bool goodbye_sent_ = false;
  std::optional<Investigation> investigation_;
};

Watchdog::Watchdog(WatchdogSettings settings, std::vector<std::string> host_of_rank)
    : loop_(std::make_unique<Loop>(settings, std::move(host_of_rank))) {}

Watchdog::~Watchdog() = default;

void Watchdog::begin_shutdown() {
  loop_->begin_shutdown();
}

const WatchdogSettings& Watchdog::settings() const {
  return loop_->settings();
}

}  // namespace zt::detail
