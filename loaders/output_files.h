// The files of an output model OUT in its folder, and what killed runs leave there.
//
//   OUT                          the graph; renaming it into place is a run's one commit point
//   OUT.<16 hex>.data            its external data, named after the content's hash (ContentHash):
//                                new data never takes the name of old data that differs, so the old
//                                graph keeps its own data until the new graph replaces it
//   .OUT.nibble-tmp-<owner>      temporaries of a running writer (graph, and .OUT.data... for data),
//   .OUT.data.nibble-tmp-<owner> named by their owner (owner.h) so only a dead run's are removed
//
// OUT.data is the name older versions gave the data; an overwrite removes it as old data.
#pragma once
#include <onnx/onnx-ml.pb.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

namespace nibble {

inline constexpr char kTmpTag[] = ".nibble-tmp-";

// ".<final_name>.nibble-tmp-<this process's owner tag>"
std::string temporary_name(const std::string& final_name);
// "<out_name>.<hash_hex>.data"
std::string data_file_name(const std::string& out_name, const std::string& hash_hex);
// OUT.<16 hex>.data of out_name.
bool is_hashed_data_file(const std::string& out_name, const std::string& name);

// Calls fn on every tensor of the graph: initializers, sparse initializers, node attributes, subgraphs.
void for_each_tensor(onnx::GraphProto& g, const std::function<void(onnx::TensorProto&)>& fn);
// The external data locations the graph file at `path` references (none if there is no such file);
// false if the file is there but cannot be read as a model.
bool external_locations(const std::string& path, std::set<std::string>* out);

// Removes the temporaries in `dir` whose owner is dead (any output's). Names without a readable owner
// (as older versions wrote) are left alone: nothing tells whether their run still lives.
void remove_stale_temporaries(const std::string& dir);
// Removes the OUT.<hash>.data files in `dir` that the graph OUT does not reference, unless a live run
// writes OUT (its new data may be in place before its graph). `keep`: canonical paths never removed.
void remove_stray_data_files(const std::string& dir, const std::string& out_name,
                             const std::vector<std::string>& keep);

}  // namespace nibble
