# engine layer fuzzers: the load index and the checksum sidecar, the two files shardpoint
# adds to a checkpoint folder (corpus: fuzz/corpus/<name>/).
sp_fuzzer(checkpoint_index_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_index_fuzzer.cc sp_engine)
sp_fuzzer(checksum_sidecar_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/checksum_sidecar_fuzzer.cc sp_engine)
