// Typed reads of environment variables; a malformed value is an error naming the variable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::env {

std::optional<std::string> get(const char* name);
std::string get_or(const char* name, const std::string& fallback);
int64_t int_or(const char* name, int64_t fallback);
double double_or(const char* name, double fallback);
bool flag(const char* name);  // 1/true/yes/on

// "64M", "4K", "1G", "123" -> bytes.
uint64_t parse_bytes(const std::string& text);
std::string format_bytes(uint64_t bytes);

}  // namespace cohort::env
