# zerocta-bench (tools/zerocta_bench/): a collective's paths side by side on the local GPUs
# (all-gather routes, and the zero-CTA policy's effect on any op), and tools/zerocta-plot for
# its JSON. Needs nvcc (sm_90 kernels), libcudart, libnccl and libcublas;
# without them the bench is skipped with a message and the rest of the build goes on.
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER OR NOT ZEROCTA_CUDART_LIBRARY OR NOT ZEROCTA_NCCL_LIBRARY
   OR NOT ZEROCTA_CUBLAS_LIBRARY)
  message(STATUS "zerocta: skipping zerocta-bench (needs nvcc, libcudart, libnccl and libcublas)")
  return()
endif()
enable_language(CUDA)

set(_zcb_dir ${CMAKE_CURRENT_LIST_DIR}/zerocta_bench)
file(GLOB _zcb_sources CONFIGURE_DEPENDS ${_zcb_dir}/*.cc ${_zcb_dir}/*.cu)
# The reduce-scatter's reduction kernel, from the library's own source (not a copy): the
# sum-kernel floor launches it with the runtime API (sum_kernel.cc), which also reads its
# argument struct from src/route/chunk_sum.h.
set(_zcb_chunk_sum ${CMAKE_SOURCE_DIR}/src/route/chunk_sum.cu)
add_executable(zerocta-bench ${_zcb_sources} ${_zcb_chunk_sum})
set_source_files_properties(${_zcb_dir}/sum_kernel.cc PROPERTIES INCLUDE_DIRECTORIES
  "${CMAKE_SOURCE_DIR}/src/route;${CMAKE_SOURCE_DIR}/src/core")
set_target_properties(zerocta-bench PROPERTIES
  CUDA_ARCHITECTURES 90
  CUDA_STANDARD 17
  CUDA_STANDARD_REQUIRED ON
  CUDA_RUNTIME_LIBRARY Shared
  LINKER_LANGUAGE CXX)

# The project-wide flags (-Wall -Wextra -Werror, sanitizers) are GCC flags that nvcc rejects:
# keep them for the C++ sources and give the .cu file nvcc's equivalents.
get_target_property(_zcb_opts zerocta-bench COMPILE_OPTIONS)
set(_zcb_cxx_opts)
if(_zcb_opts)
  foreach(opt ${_zcb_opts})
    list(APPEND _zcb_cxx_opts $<$<COMPILE_LANGUAGE:CXX>:${opt}>)
  endforeach()
endif()
set_property(TARGET zerocta-bench PROPERTY COMPILE_OPTIONS ${_zcb_cxx_opts}
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)

target_include_directories(zerocta-bench PRIVATE ${_zcb_dir} ${CMAKE_SOURCE_DIR}/include)
target_include_directories(zerocta-bench SYSTEM PRIVATE ${ZEROCTA_NCCL_INCLUDE_DIR}
                                                        ${ZEROCTA_CUDA_INCLUDE_DIR})
# libzerocta.so is never linked: the zerocta paths get it through LD_PRELOAD, and the bench
# finds its counters with dlsym(RTLD_DEFAULT, "zerocta_get_stats").
target_link_libraries(zerocta-bench PRIVATE ${ZEROCTA_NCCL_LIBRARY} ${ZEROCTA_CUBLAS_LIBRARY}
                                            ${ZEROCTA_CUDART_LIBRARY} ${CMAKE_DL_LIBS}
                                            Threads::Threads)
install(TARGETS zerocta-bench RUNTIME DESTINATION bin)
install(PROGRAMS ${CMAKE_CURRENT_LIST_DIR}/zerocta-plot DESTINATION bin)

# CPU tests (no GPU needed): the self-test, full runs on fake GPUs of every --op (launcher,
# protocol, tables, JSON, fault handling) and the plot script on that JSON. The top level enables testing
# only after add_subdirectory(tools), so enable it here for this directory as well.
if(NOT ZEROCTA_BUILD_TESTS)
  return()
endif()
enable_testing()
add_test(NAME zerocta_bench_self_test COMMAND zerocta-bench --self-test)
add_test(NAME zerocta_bench_fake_run
         COMMAND ${CMAKE_COMMAND} -E env ZEROCTA_LIB=$<TARGET_FILE:zerocta>
                 bash ${_zcb_dir}/test_fake_run.sh $<TARGET_FILE:zerocta-bench>
                 ${CMAKE_CURRENT_LIST_DIR}/zerocta-plot)
