#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "selfattn/context.h"
#include "selfattn/error.h"
#include "selfattn/tensor.h"

namespace selfattn {

namespace detail {
// Untyped owner of one device allocation; DeviceBuffer<T> is its typed face. Holds the runtime
// alive, so a buffer may outlive the Context that made it.
class RawBuffer {
 public:
  RawBuffer() = default;
  RawBuffer(Context& ctx, size_t bytes, const char* label);
  ~RawBuffer();
  RawBuffer(RawBuffer&&) noexcept;
  RawBuffer& operator=(RawBuffer&&) noexcept;
  RawBuffer(const RawBuffer&) = delete;
  RawBuffer& operator=(const RawBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  // Copies bytes [offset, offset+n) of the buffer from/to host memory. Sync versions return when
  // the copy is done; async ones queue it on the context's stream (the host memory must stay
  // alive and untouched until Context::synchronize()).
  void upload(const void* src, size_t n, size_t offset, bool async);
  void download(void* dst, size_t n, size_t offset, bool async) const;
  void fill_bytes(unsigned char byte);  // sync

 private:
  std::shared_ptr<Device> device_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};
}  // namespace detail

// A typed, RAII, move-only device allocation of `size()` elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Context& ctx, size_t count, const char* label = "DeviceBuffer")
      : raw_(ctx, count * sizeof(T), label), size_(count) {}

  T* data() const { return static_cast<T*>(raw_.data()); }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  bool empty() const { return size_ == 0; }

  void copy_from_host(const T* src, size_t count, size_t offset = 0) { checked(count, offset); raw_.upload(src, count * sizeof(T), offset * sizeof(T), false); }
  void copy_to_host(T* dst, size_t count, size_t offset = 0) const { checked(count, offset); raw_.download(dst, count * sizeof(T), offset * sizeof(T), false); }
  void copy_from_host_async(const T* src, size_t count, size_t offset = 0) { checked(count, offset); raw_.upload(src, count * sizeof(T), offset * sizeof(T), true); }
  void copy_to_host_async(T* dst, size_t count, size_t offset = 0) const { checked(count, offset); raw_.download(dst, count * sizeof(T), offset * sizeof(T), true); }

  void copy_from_host(const std::vector<T>& src) { copy_from_host(src.data(), src.size()); }
  std::vector<T> to_host() const {
    std::vector<T> out(size_);
    copy_to_host(out.data(), size_);
    return out;
  }
  void fill_bytes(unsigned char byte) { raw_.fill_bytes(byte); }

 private:
  // Throws InvalidArgument for a copy that would run past the end.
  void checked(size_t count, size_t offset) const {
    if (offset > size_ || count > size_ - offset) {
      throw InvalidArgument("DeviceBuffer copy: elements [" + std::to_string(offset) + ", " +
                            std::to_string(offset) + " + " + std::to_string(count) + ") expected within the buffer's " +
                            std::to_string(size_) + " elements");
    }
  }
  detail::RawBuffer raw_;
  size_t size_ = 0;
};

}  // namespace selfattn
