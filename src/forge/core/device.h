#pragma once
// Where a tensor lives: the CPU or CUDA device n.
#include <cstdint>
#include <string>

namespace forge {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::CPU ? 0 : i) {}
  static Device cpu() { return Device(DeviceType::CPU); }
  static Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }
  // Parses "cpu", "cuda", "cuda:1" (the spelling only; parse_device also resolves "auto"
  // and checks that the GPU exists).
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

inline const Device kCPU = Device::cpu();

// A device named by the user (--device, run.device): "cpu", "cuda" (= cuda:0), "cuda:N", or
// "auto" (cuda:0 when a GPU is visible, else the CPU), checked against `cuda_devices`
// visible GPUs. Errors name the spec and the fix: "unknown device 'gpu0'; expected cpu,
// cuda, cuda:N or auto", "cuda:3 requested but 1 CUDA device is visible".
Device parse_device(const std::string& spec, int cuda_devices);
// The same against the GPUs this process sees (none in a build without CUDA).
Device parse_device(const std::string& spec);

}  // namespace forge
