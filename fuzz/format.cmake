# format layer fuzzers (corpus: fuzz/corpus/metadata_fuzzer/).
sp_fuzzer(metadata_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/metadata_fuzzer.cc sp_format)
# The safetensors header parser (Hugging Face folders, DCP's safetensors items; corpus:
# fuzz/corpus/safetensors_header_fuzzer/, files PyTorch 2.15 wrote).
sp_fuzzer(safetensors_header_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_header_fuzzer.cc sp_format)
