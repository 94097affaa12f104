// The C API over Lightning's checkpoint-folder rules (engine/checkpoint_files.h) and the
// split of a rank's items into data files (engine/save_plan.h): the engine's rules, for
// bindings that adapt them to a framework's interface (include/shardpoint/c_api.h).
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "capi/c_api_util.h"
#include "engine/checkpoint_files.h"
#include "engine/save_plan.h"

using namespace shardpoint;
using namespace shardpoint::capi;

extern "C" {

void sp_string_list_free(sp_string_list* list) {
  if (list == nullptr) return;
  for (std::size_t i = 0; i < list->count && list->items != nullptr; ++i) std::free(list->items[i]);
  std::free(list->items);
  list->items = nullptr;
  list->count = 0;
}

sp_status sp_checkpoint_committed(const char* path_or_url, int* committed, char** error) {
  return guarded(error, [&] {
    require(committed != nullptr, "committed is NULL");
    *committed = engine::is_committed(Location::parse(str(path_or_url, "path_or_url is NULL"))) ? 1 : 0;
  });
}

sp_status sp_list_committed_checkpoints(const char* folder, sp_string_list* paths, char** error) {
  return guarded(error, [&] {
    require(paths != nullptr, "paths is NULL");
    paths->count = 0;
    paths->items = nullptr;
    const std::vector<Location> found =
        engine::list_committed_checkpoints(Location::parse(str(folder, "folder is NULL")));
    sp_string_list out{0, static_cast<char**>(std::calloc(std::max<std::size_t>(found.size(), 1), sizeof(char*)))};
    if (out.items == nullptr) throw std::bad_alloc();
    for (const Location& path : found) {
      out.items[out.count] = copy_string(path.to_string());
      if (out.items[out.count] == nullptr) {
        sp_string_list_free(&out);
        throw std::bad_alloc();
      }
      ++out.count;
    }
    *paths = out;
  });
}

sp_status sp_remove_checkpoint(const char* path_or_url, char** error) {
  return guarded(error, [&] { engine::remove_checkpoint(Location::parse(str(path_or_url, "path_or_url is NULL"))); });
}

sp_status sp_staging_folder(const char* target, const char* tag, char** path, char** error) {
  return guarded(error, [&] {
    require(path != nullptr, "path is NULL");
    const Location staged =
        engine::staging_path(Location::parse(str(target, "target is NULL")), str(tag, "tag is NULL"));
    *path = copy_string_or_throw(staged.to_string());
  });
}

sp_status sp_remove_stale_staging(const char* target, size_t* removed, char** error) {
  return guarded(error, [&] {
    const std::size_t n = engine::remove_stale_staging_of(Location::parse(str(target, "target is NULL")));
    if (removed != nullptr) *removed = n;
  });
}

sp_status sp_split_into_files(const sp_checkpoint* checkpoint, int thread_count, int single_file_per_rank,
                              const int* kinds, const uint64_t* nbytes, size_t count, int* file_of_item, size_t* order,
                              int* file_count, char** error) {
  return guarded(error, [&] {
    require(file_count != nullptr &&
                (count == 0 || (kinds != nullptr && nbytes != nullptr && file_of_item != nullptr && order != nullptr)),
            "NULL argument");
    require(thread_count >= 1, "thread_count must be >= 1");
    std::vector<engine::ItemWeight> items(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (kinds[i] != SP_ITEM_TENSOR && kinds[i] != SP_ITEM_BYTES) {
        throw UsageError("item #" + std::to_string(i) + ": unknown kind " + std::to_string(kinds[i]));
      }
      items[i].type = kinds[i] == SP_ITEM_BYTES ? engine::WriteItemType::kBytes : engine::WriteItemType::kTensor;
      items[i].nbytes = nbytes[i];
    }
    engine::SavePlanOptions options;
    options.single_file_per_rank = single_file_per_rank != 0;
    options.thread_count = sp_checkpoint_files_per_rank(checkpoint, thread_count);
    std::size_t next = 0;
    int files = 0;
    for (const std::vector<std::size_t>& file : engine::split_into_files(items, options)) {
      if (file.empty()) continue;  // empty files come last; none is written
      for (std::size_t i : file) {
        file_of_item[i] = files;
        order[next++] = i;
      }
      ++files;
    }
    *file_count = files;
  });
}

}  // extern "C"
