// RawBuffer: one device allocation owned by value, holding its runtime alive.
#include <string>
#include <utility>

#include "runtime/context_state.h"
#include "selfattn/buffer.h"
#include "selfattn/error.h"

namespace selfattn::detail {

RawBuffer::RawBuffer(Context& ctx, size_t bytes, const char* label) : device_(ctx.state().device), bytes_(bytes) {
  if (bytes_ > 0) data_ = device_->allocate(bytes_, label);
}

RawBuffer::~RawBuffer() {
  if (data_) device_->deallocate(data_);
}

RawBuffer::RawBuffer(RawBuffer&& other) noexcept
    : device_(std::move(other.device_)), data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

RawBuffer& RawBuffer::operator=(RawBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) device_->deallocate(data_);
    device_ = std::move(other.device_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

namespace {
void check_range(size_t n, size_t offset, size_t bytes, const char* what) {
  if (offset > bytes || n > bytes - offset) {
    throw InvalidArgument(std::string(what) + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset) +
                          " + " + std::to_string(n) + ") expected within the buffer's " + std::to_string(bytes) +
                          " bytes");
  }
}
}  // namespace

void RawBuffer::upload(const void* src, size_t n, size_t offset, bool async) {
  check_range(n, offset, bytes_, "buffer upload");
  if (n == 0) return;
  if (src == nullptr) throw InvalidArgument("buffer upload: source expected non-null, got null");
  device_->copy(static_cast<unsigned char*>(data_) + offset, src, n, async);
}

void RawBuffer::download(void* dst, size_t n, size_t offset, bool async) const {
  check_range(n, offset, bytes_, "buffer download");
  if (n == 0) return;
  if (dst == nullptr) throw InvalidArgument("buffer download: destination expected non-null, got null");
  device_->copy(dst, static_cast<const unsigned char*>(data_) + offset, n, async);
}

void RawBuffer::fill_bytes(unsigned char byte) {
  if (bytes_ == 0) return;
  device_->fill(data_, byte, bytes_);
  device_->synchronize();
}

}  // namespace selfattn::detail
