#include <gtest/gtest.h>

TEST(Placeholder, BeingWritten) { GTEST_SKIP() << "issue 4 in progress"; }
