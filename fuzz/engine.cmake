# engine layer fuzzers: the load index and the checksum sidecar, the two files shardpoint
# adds to a checkpoint folder (corpus: fuzz/corpus/<name>/).
sp_fuzzer(checkpoint_index_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_index_fuzzer.cc sp_engine)
sp_fuzzer(checksum_sidecar_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/checksum_sidecar_fuzzer.cc sp_engine)
# zstd items ("stream.zstd/1"): decompression into head + tail or whole images, the second
# pass, the torch.save parser behind them, and the writer's round trip (corpus: items
# PyTorch 2.15's ZStandard extension wrote, fuzz/corpus/zstd_item_fuzzer/).
sp_fuzzer(zstd_item_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/zstd_item_fuzzer.cc sp_engine)
