// What the method and format registries (methods.h, formats.h) share: a table of records, each with a
// `name` and an enum value, looked up by either.
#pragma once
#include <string>
#include <vector>

#include "loaders/error.h"

namespace nibble {

// The record whose `field` is `value`; a value without one is a table that missed an enum value.
template <typename Record, typename Enum>
const Record& record_of(const std::vector<Record>& table, Enum Record::*field, Enum value, const char* what) {
  for (const Record& r : table)
    if (r.*field == value) return r;
  throw Error(std::string(what) + " " + std::to_string(int(value)) + " has no record in its table");
}

// The record called `name`; null: none.
template <typename Record>
const Record* find_named(const std::vector<Record>& table, const std::string& name) {
  for (const Record& r : table)
    if (name == r.name) return &r;
  return nullptr;
}

// Every record's name, in the table's order (the choices an unknown name's error lists).
template <typename Record>
std::vector<const char*> names_of(const std::vector<Record>& table) {
  std::vector<const char*> names;
  for (const Record& r : table) names.push_back(r.name);
  return names;
}

}  // namespace nibble
