# zerocta-overhead: CPU cost of the shim per forwarded NCCL call (ncclX through the shim
# against pncclX, the same real function, never intercepted), in one process.
if(ZEROCTA_NCCL_LIBRARY)
  add_executable(zerocta-overhead ${CMAKE_CURRENT_LIST_DIR}/zerocta_overhead/overhead_main.cc)
  target_include_directories(zerocta-overhead SYSTEM PRIVATE ${ZEROCTA_CUDA_INCLUDE_DIR}
                             ${ZEROCTA_NCCL_INCLUDE_DIR})
  target_link_libraries(zerocta-overhead PRIVATE ${ZEROCTA_NCCL_LIBRARY} ${CMAKE_DL_LIBS})
  if(ZEROCTA_BUILD_TESTS)
    # Smoke run against the null NCCL (no threshold: performance is reported, not asserted).
    add_test(NAME zerocta_overhead_smoke
             COMMAND env LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/null_nccl
                     LD_PRELOAD=$<TARGET_FILE:zerocta> ZEROCTA_ALLGATHER=off
                     $<TARGET_FILE:zerocta-overhead> 200000)
    set_tests_properties(zerocta_overhead_smoke PROPERTIES LABELS nosan)
  endif()
endif()

# The null NCCL baseline (tools/zerocta_overhead/null_nccl.cc), in its own directory.
add_library(zerocta_null_nccl SHARED ${CMAKE_CURRENT_LIST_DIR}/zerocta_overhead/null_nccl.cc)
target_include_directories(zerocta_null_nccl SYSTEM PRIVATE ${ZEROCTA_CUDA_INCLUDE_DIR}
                           ${ZEROCTA_NCCL_INCLUDE_DIR})
set_target_properties(zerocta_null_nccl PROPERTIES OUTPUT_NAME nccl SOVERSION 2
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/null_nccl)
