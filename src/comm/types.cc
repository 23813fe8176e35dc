#include "cohort/comm/types.h"

#include <cstring>

#include "cohort/core/error.h"

namespace cohort::comm {

const char* dtype_name(DataType t) {
  static const char* names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
  auto i = static_cast<size_t>(t);
  return i < 7 ? names[i] : "invalid";
}

const char* redop_name(RedOp op) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg"};
  auto i = static_cast<size_t>(op);
  return i < 5 ? names[i] : "invalid";
}

DataType parse_dtype(const std::string& s) {
  for (DataType t : kAllDataTypes) {
    if (s == dtype_name(t)) return t;
  }
  if (s == "float") return DataType::f32;
  if (s == "double") return DataType::f64;
  if (s == "half") return DataType::f16;
  if (s == "int32") return DataType::i32;
  if (s == "int64") return DataType::i64;
  if (s == "uint8") return DataType::u8;
  COHORT_THROW("unknown data type '" << s << "' (f32, f64, f16, bf16, i32, i64, u8)");
}

RedOp parse_redop(const std::string& s) {
  for (RedOp op : kAllRedOps) {
    if (s == redop_name(op)) return op;
  }
  COHORT_THROW("unknown reduction '" << s << "' (sum, prod, min, max, avg)");
}

}  // namespace cohort::comm
