# zerocta-demo: the README's main job. A side-by-side all-gather on the local GPUs: NCCL's own
# path (pncclAllGather, which the shim never intercepts) against the routed ncclAllGather.
if(ZEROCTA_NCCL_LIBRARY AND ZEROCTA_CUDART_LIBRARY)
  add_executable(zerocta-demo ${CMAKE_CURRENT_LIST_DIR}/zerocta_demo/demo_main.cc
                              ${CMAKE_CURRENT_LIST_DIR}/zerocta_demo/shareable_memory.cc)
  target_include_directories(zerocta-demo PRIVATE ${CMAKE_SOURCE_DIR}/include)
  target_include_directories(zerocta-demo SYSTEM PRIVATE ${ZEROCTA_CUDA_INCLUDE_DIR}
                             ${ZEROCTA_NCCL_INCLUDE_DIR})
  target_link_libraries(zerocta-demo PRIVATE ${ZEROCTA_NCCL_LIBRARY} ${ZEROCTA_CUDART_LIBRARY}
                        ${CMAKE_DL_LIBS})
  install(TARGETS zerocta-demo RUNTIME DESTINATION bin)
endif()
