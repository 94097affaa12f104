# storage layer fuzzers: the location parser every layer classifies paths and URLs with
# (corpus: fuzz/corpus/location_fuzzer/).
sp_fuzzer(location_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/location_fuzzer.cc sp_storage)
