#include "forge/core/storage.h"

namespace forge {

Storage::Storage(size_t nbytes, Allocator* allocator)
    : nbytes_(nbytes), device_(allocator->device()), allocator_(allocator) {
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() {
  if (data_) allocator_->deallocate(data_, nbytes_);
}

void Storage::release() {
  if (released_) return;
  if (data_) allocator_->deallocate(data_, nbytes_);
  data_ = nullptr;
  released_ = true;
}

void Storage::reallocate() {
  if (!released_) return;
  data_ = allocator_->allocate(nbytes_);
  released_ = false;
}

}  // namespace forge
