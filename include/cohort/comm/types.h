// Element types and reduction operators of the collective library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cohort/core/half.h"

namespace cohort::comm {

enum class DataType : uint8_t { f32 = 0, f64, f16, bf16, i32, i64, u8 };
enum class RedOp : uint8_t { sum = 0, prod, min, max, avg };

inline constexpr DataType kAllDataTypes[] = {DataType::f32,  DataType::f64, DataType::f16,
                                             DataType::bf16, DataType::i32, DataType::i64,
                                             DataType::u8};
inline constexpr RedOp kAllRedOps[] = {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max, RedOp::avg};

inline size_t dtype_size(DataType t) {
  constexpr size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
  return static_cast<size_t>(t) < 7 ? sizes[static_cast<size_t>(t)] : 0;
}
const char* dtype_name(DataType t);
const char* redop_name(RedOp op);
DataType parse_dtype(const std::string& s);  // throws naming the value
RedOp parse_redop(const std::string& s);

// f16 and bf16 values convert with core's f16_to_f32, f32_to_bf16, ... (cohort/core/half.h).
using cohort::bf16_to_f32;
using cohort::f16_to_f32;
using cohort::f32_to_bf16;
using cohort::f32_to_f16;

}  // namespace cohort::comm
