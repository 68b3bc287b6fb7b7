#include "forge/core/storage.h"

namespace forge {

Storage::Storage(size_t nbytes, Allocator* allocator)
    : nbytes_(nbytes), device_(allocator->device()), allocator_(allocator) {
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() {
  if (data_) allocator_->deallocate(data_, nbytes_);
}

}  // namespace forge
