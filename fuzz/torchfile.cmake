# torchfile parsers: the zip reader alone, and the whole torch.save reader (zip + pickle + tensors).
sp_fuzzer(zip_reader_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/zip_reader_fuzzer.cc sp_torchfile)
sp_fuzzer(torch_file_fuzzer ${CMAKE_CURRENT_SOURCE_DIR}/torch_file_fuzzer.cc sp_torchfile)
