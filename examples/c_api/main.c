/* A C program that uses shardpoint through its installed package: saves a tensor as a DCP
 * checkpoint, loads half of it back, consolidates it into one torch.save file.
 *
 *   cmake -S examples/c_api -B build-example -DCMAKE_PREFIX_PATH=<install prefix>
 *   cmake --build build-example && build-example/c_api_example /tmp/ckpt
 */
#include <shardpoint/c_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(sp_status status, char* error) {
  fprintf(stderr, "c_api_example: error %d: %s\n", (int)status, error ? error : "?");
  sp_free(error);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: c_api_example CHECKPOINT_FOLDER\n");
    return 2;
  }
  char folder[4096];
  snprintf(folder, sizeof folder, "%s", argv[1]);
  char* error = NULL;
  sp_checkpoint* ckpt = NULL;
  sp_status s = sp_checkpoint_open(folder, &ckpt, &error);
  if (s != SP_OK) return fail(s, error);

  float weights[6] = {1, 2, 3, 4, 5, 6};
  const int64_t shape[2] = {3, 2}, zero[2] = {0, 0};
  sp_tensor t = {"weight", "float32", 2, shape, zero, shape, weights, sizeof weights};
  s = sp_save(ckpt, &t, 1, NULL, &error);
  if (s != SP_OK) return fail(s, error);

  float rows[4] = {0};
  const int64_t offsets[2] = {1, 0}, sizes[2] = {2, 2};
  sp_tensor part = {"weight", "float32", 2, shape, offsets, sizes, rows, sizeof rows};
  s = sp_load(ckpt, &part, 1, NULL, &error);
  if (s != SP_OK) return fail(s, error);
  printf("shardpoint %s: rows 1-2 of weight: %g %g %g %g\n", sp_version(), rows[0], rows[1], rows[2], rows[3]);
  sp_checkpoint_close(ckpt);
  return rows[0] == 3 && rows[3] == 6 ? 0 : 1;
}
