# zerocta-ce-probe: where the copy-engine all-gather's time goes on this machine (peer pulls,
# local copies, and both at once), one process with peer access between all GPUs.
if(ZEROCTA_CUDART_LIBRARY)
  add_executable(zerocta-ce-probe ${CMAKE_CURRENT_LIST_DIR}/zerocta_ce_probe/ce_probe_main.cc)
  target_include_directories(zerocta-ce-probe SYSTEM PRIVATE ${ZEROCTA_CUDA_INCLUDE_DIR})
  target_link_libraries(zerocta-ce-probe PRIVATE ${ZEROCTA_CUDART_LIBRARY} Threads::Threads)
endif()
