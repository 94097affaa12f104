# format layer fuzzers (corpus: fuzz/corpus/metadata_fuzzer/).
sp_fuzzer(metadata_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/metadata_fuzzer.cc sp_format)
