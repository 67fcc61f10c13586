// Linked into the test executables that a sanitized build with LibTorch runs (label
// "torch-san", zinf_add_sanitized_tests in cmake/zinf_options.cmake). LibTorch, libgloo and
// libtbb are Debian's uninstrumented builds: the sanitizers see zinf's code and the calls the
// libraries make into intercepted functions (malloc/free, memcpy, pthread_*), but none of the
// libraries' own loads, stores or atomics. What follows from that, and only from that, is
// settled here, in the binary, so that a plain `ctest -L torch-san` needs no environment.

#if defined(__SANITIZE_THREAD__)
#include <tbb/global_control.h>

namespace {

// TBB runs every parallel loop on the thread that starts it, with no workers. TSan sees the
// bodies of a parallel_for or parallel_reduce (inlined into zinf's instrumented code) run on
// TBB's workers, but not the scheduler's hand-off, inside libtbb, that orders them with the
// thread waiting for the loop: every buffer the optimizer's step or a dtype conversion writes
// on a worker and the caller reads afterwards was reported as a race (some 800 reports in
// the zero and engine suites, all of that one kind). With one TBB thread the loops run inline
// and the threads TSan checks are zinf's own: aio workers, the swappers' writers, the
// parameter coordinator's prefetches, the Gloo communicator's worker and heartbeat, the
// checkpoint threads.
const tbb::global_control kOneTbbThread(tbb::global_control::max_allowed_parallelism, 1);

}  // namespace

// TSan's options. history_size=7 (the largest; 2 by default) keeps enough of each thread's
// history to restore the stack of a report's earlier access. Without it, 1 run in 3 of
// GlooCommunicator.CollectivesThreeRanksC10dAuto reported LibTorch's Gloo worker freeing a
// Work in c10d::ProcessGroupGloo::runLoop against an earlier access by zinf's worker whose
// stack TSan could not restore ("[failed to restore the stack]"), so the suppressions below,
// which match on the frames of either access, could not apply; with it, 9 runs of that case
// reported nothing.
extern "C" const char* __tsan_default_options() { return "history_size=7"; }

// TSan's suppressions (read once at start-up). A pattern matches when any frame of either
// access's stack contains it. None names a zinf function, and none hides an access to
// zinf's own buffers: a race whose accesses are in zinf's code is fixed in the code, never
// listed here.
extern "C" const char* __tsan_default_suppressions() {
  return
      // A c10d Work (one per Gloo send, recv or collective, zero/comm/gloo_communicator.cc)
      // is completed by LibTorch's Gloo worker thread, which broadcasts the Work's condition
      // variable in finishWorkGloo() after unlocking its mutex and then drops its reference
      // with an atomic decrement TSan cannot see. zinf's worker, holding the last reference,
      // destroys the Work and its condition variable; TSan reports the destruction against
      // the broadcast. The order is real (the reference count's acquire/release), only
      // invisible.
      "race:c10d::ProcessGroupGloo::AsyncWork::finishWorkGloo\n"
      // The same Work the other way round: zinf's worker waits in c10d::Work::wait()
      // (LibTorch) and drops its reference first; LibTorch's worker drops the last one in
      // runLoop() and frees the Work. TSan reports the free against the wait's read of the
      // condition variable.
      "race:c10d::Work::wait\n"
      // c10::intrusive_ptr (an at::Tensor's TensorImpl, a c10d Work) counts references with
      // an atomic decrement inlined both into zinf's instrumented code
      // (c10/util/intrusive_ptr.h) and into LibTorch's uninstrumented code. When LibTorch's
      // side drops the last reference and frees the object, TSan has seen only zinf's
      // decrement and reports the free against it. Only reports in which one access is that
      // decrement itself match.
      "race:c10::detail::atomic_refcount_decrement\n";
}
#endif
