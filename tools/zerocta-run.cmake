# zerocta-run: the launcher script. Copied to <build>/tools/zerocta-run so that the copy finds
# the build's library as ../libzerocta.so, exactly as the installed one finds ../lib/libzerocta.so
# (the top-level CMakeLists.txt installs it to bin/). configure_file re-copies it whenever the
# source changes (the next build re-runs CMake) and keeps its executable bit.
configure_file(${CMAKE_CURRENT_LIST_DIR}/zerocta-run ${CMAKE_CURRENT_BINARY_DIR}/zerocta-run
               COPYONLY)
