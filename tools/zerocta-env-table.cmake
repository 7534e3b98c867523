# zerocta-env-table: prints the ZEROCTA_* table for README.md from src/core/config.cc.
# Host-only: needs neither CUDA nor NCCL at run time. It links just config.cc (plain,
# dependency-free code) so it builds even while the rest of src/ is in progress.
add_executable(zerocta-env-table
  ${CMAKE_CURRENT_LIST_DIR}/zerocta_env_table.cc ${CMAKE_SOURCE_DIR}/src/core/config.cc)
target_include_directories(zerocta-env-table PRIVATE ${CMAKE_SOURCE_DIR}/src/core)
