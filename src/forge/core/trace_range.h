#pragma once
// Named ranges of work for a step trace (train/step_trace.h) and an Nsight timeline: the blocks'
// forward and backward, the optimizer. Nothing happens unless a sink is installed on the thread
// (telemetry.profile_steps while a traced step runs), so the models call it unconditionally.
//
//   { trace::Range r("forward: block 3"); ... }   // a stable C string (interned, or a literal)
//   trace::BlockScope b(3);                       // forward: block 3, and nodes recorded inside
//                                                 // remember block 3 for the backward's ranges
#include <cstdint>

namespace forge::trace {

class RangeSink {
 public:
  virtual ~RangeSink() = default;
  virtual void begin_range(const char* name) = 0;  // nested: ended in reverse order
  virtual void end_range() = 0;
  // A point in time (a collective launched): the host track and an NVTX mark.
  virtual void instant(const char* name) { (void)name; }
};

// sink()->instant(name) when a sink is installed.
void instant(const char* name);

// The sink of this thread (nullptr: ranges do nothing).
void set_sink(RangeSink* sink);
RangeSink* sink();

class Range {
 public:
  explicit Range(const char* name) : sink_(sink()) {
    if (sink_) sink_->begin_range(name);
  }
  ~Range() {
    if (sink_) sink_->end_range();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  RangeSink* sink_;
};

// The transformer block whose forward is running on this thread (-1: none); autograd nodes
// recorded meanwhile keep it (Node::block) and the engine opens "backward: block i" ranges
// around them.
int64_t current_block();
const char* backward_block_name(int64_t i);  // "backward: block i", interned

class BlockScope {
 public:
  explicit BlockScope(int64_t block);  // also a Range "forward: block i"
  ~BlockScope();
  BlockScope(const BlockScope&) = delete;
  BlockScope& operator=(const BlockScope&) = delete;

 private:
  int64_t previous_;
  Range range_;
};

}  // namespace forge::trace
