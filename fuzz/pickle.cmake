# Pickle reader fuzzer: read; on success write (protocols 2 and 4) and read back equal.
sp_fuzzer(pickle_reader_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/pickle_reader_fuzzer.cc sp_pickle)
