# storage layer fuzzers: Location::parse (include/shardpoint/location.h), the one parser of
# paths and URLs, round-tripped part by part (corpus: fuzz/corpus/location_fuzzer/).
sp_fuzzer(location_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/location_fuzzer.cc sp_storage)
# The check of a server's 206 Content-Range against the range asked (corpus:
# fuzz/corpus/content_range_fuzzer/).
sp_fuzzer(content_range_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/content_range_fuzzer.cc sp_storage)
