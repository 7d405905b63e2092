// The runtime's late streams (cuda_fibers_streams.hpp, CUDA_FIBERS_STREAMS=async): what the CUDA-on-host
// build's GPU tests run on. These show that work the program did not order is run out of order, that
// copies to pinned memory land only when the device reaches them, and that stream-ordered memory is
// poisoned and reused as CUDA's pool may. Run by ctest with CUDA_FIBERS_STREAMS=async
// and CUDA_FIBERS_LATE_MS=1000 (unit.cuda_on_host.late_streams: nothing runs before the host waits,
// so the order is the scheduler's, not the machine's load); each test first checks that streams do
// run late. The fault test leaves the device's sticky error, so it runs in a process of its own.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fault_kernels.hpp"

namespace {

constexpr std::size_t kBytes = 64;

/// Streams, an event, a device buffer and a pinned one, for one test.
class LateStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda_fibers::streams_run_late()) << "run with CUDA_FIBERS_STREAMS=async";
    ASSERT_EQ(cudaStreamCreateWithFlags(&producer_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&consumer_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&device_, kBytes), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(&pinned_, kBytes, cudaHostAllocDefault), cudaSuccess);
    ASSERT_EQ(cudaMemset(device_, 0, kBytes), cudaSuccess);
    std::memset(pinned_, 0, kBytes);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void TearDown() override {
    cudaDeviceSynchronize();
    cudaFreeHost(pinned_);
    cudaFree(device_);
    cudaEventDestroy(produced_);
    cudaStreamDestroy(consumer_);
    cudaStreamDestroy(producer_);
  }
  unsigned char pinned(std::size_t index) const { return static_cast<const unsigned char*>(pinned_)[index]; }

  cudaStream_t producer_ = nullptr, consumer_ = nullptr;
  cudaEvent_t produced_ = nullptr;
  void* device_ = nullptr;
  void* pinned_ = nullptr;
};

TEST_F(LateStreams, AConsumerThatDoesNotWaitForItsProducerRunsFirst) {
  ASSERT_EQ(cudaMemsetAsync(device_, 0x3f, kBytes, producer_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, consumer_), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pinned(0), 0) << "the copy on the other stream read the buffer before the memset";
}

TEST_F(LateStreams, AConsumerThatWaitsForAnEventReadsWhatTheProducerWrote) {
  ASSERT_EQ(cudaMemsetAsync(device_, 0x3f, kBytes, producer_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(produced_, producer_), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer_, produced_, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, consumer_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer_), cudaSuccess);
  EXPECT_EQ(pinned(0), 0x3f);
  EXPECT_EQ(pinned(kBytes - 1), 0x3f);
}

TEST_F(LateStreams, ACopyToPinnedMemoryLandsWhenTheDeviceReachesIt) {
  ASSERT_EQ(cudaMemsetAsync(device_, 0x11, kBytes, producer_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, producer_), cudaSuccess);
  EXPECT_EQ(pinned(0), 0) << "read before the stream was synchronized";
  EXPECT_EQ(cudaEventRecord(produced_, producer_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(produced_), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(produced_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(produced_), cudaSuccess);
  EXPECT_EQ(pinned(0), 0x11);
}

TEST_F(LateStreams, ACopyFromPageableMemoryTakesItsSourceAtTheCall) {
  std::vector<unsigned char> pageable(kBytes, 0x22);
  ASSERT_EQ(cudaMemcpyAsync(device_, pageable.data(), kBytes, cudaMemcpyHostToDevice, producer_),
            cudaSuccess);
  pageable.assign(kBytes, 0x33);  // allowed: CUDA staged the source before returning
  std::vector<unsigned char> back(kBytes, 0);
  // To pageable memory: done on return.
  ASSERT_EQ(cudaMemcpyAsync(back.data(), device_, kBytes, cudaMemcpyDeviceToHost, producer_), cudaSuccess);
  EXPECT_EQ(back[0], 0x22);
}

TEST_F(LateStreams, TheLegacyStreamWaitsForBlockingStreamsOnly) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device_, 0x44, kBytes, blocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(pinned(0), 0x44) << "the legacy default stream waits for a blocking stream's work";
  ASSERT_EQ(cudaMemsetAsync(device_, 0x55, kBytes, producer_), cudaSuccess);  // non-blocking
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(pinned(0), 0x44) << "the legacy default stream does not wait for a non-blocking stream";
  cudaStreamDestroy(blocking);
}

TEST_F(LateStreams, StreamOrderedMemoryIsReusedInStreamOrderAndPoisoned) {
  void* first = nullptr;
  ASSERT_EQ(cudaMallocAsync(&first, kBytes, producer_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(first, 0, kBytes, producer_), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(first, producer_), cudaSuccess);
  void* on_another_stream = nullptr;
  ASSERT_EQ(cudaMallocAsync(&on_another_stream, kBytes, consumer_), cudaSuccess);
  EXPECT_NE(on_another_stream, first) << "another stream must not get a block whose free is pending";
  void* again = nullptr;
  ASSERT_EQ(cudaMallocAsync(&again, kBytes, producer_), cudaSuccess);
  EXPECT_EQ(again, first) << "the freeing stream reuses the block at once, in its order";
  ASSERT_EQ(cudaMemcpyAsync(pinned_, again, kBytes, cudaMemcpyDeviceToHost, producer_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(producer_), cudaSuccess);
  EXPECT_EQ(pinned(0), 0xff) << "a new allocation holds 0xff bytes (NaN), not the memset's zeros";
  ASSERT_EQ(cudaFreeAsync(again, producer_), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(on_another_stream, consumer_), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(LateStreamsFault, AKernelFaultIsTheStickyErrorOfTheNextSynchronize) {
  ASSERT_TRUE(cuda_fibers::streams_run_late()) << "run with CUDA_FIBERS_STREAMS=async";
  fault_kernels::divergent_barrier();  // a valid launch: the fault comes when the device runs it
  const cudaError_t status = cudaDeviceSynchronize();
  EXPECT_EQ(status, cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(status)).find("deadlock"), std::string::npos)
      << cudaGetErrorString(status);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "sticky: never cleared";
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

}  // namespace
