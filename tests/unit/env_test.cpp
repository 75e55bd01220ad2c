// SCMOE_* environment variables (scmoe/kernels/env.h, issue 26): a malformed value throws
// scmoe::Error naming the variable, its value and what it accepts, where the library reads it
// (never an abort, never read as a default). Each test sets its variables and runs in its own
// process (gtest discovery), so the settings the library caches start unread.
#include "scmoe/kernels/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "scmoe/kernels/device.h"
#include "scmoe/kernels/error.h"

namespace scmoe {
namespace {

std::string error_of(void (*fn)()) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// SCMOE_CPU_BLAS_THREADS=abc aborted the process (std::terminate: the stream's worker thread was
// started before the value was read, and destroyed joinable when it threw).
TEST(Env, MalformedBlasThreadsThrowsFromStreamCreation) {
    ::setenv("SCMOE_CPU_BLAS_THREADS", "abc", 1);
    const std::string e = error_of([] {
        auto device = make_device("cpu");
        auto stream = device->create_stream();
    });
    EXPECT_NE(e.find("SCMOE_CPU_BLAS_THREADS='abc': expected an integer from 1 to 4096"), std::string::npos) << e;
    ::setenv("SCMOE_CPU_BLAS_THREADS", "2", 1);
    auto device = make_device("cpu");
    EXPECT_NO_THROW(device->create_stream());
    ::unsetenv("SCMOE_CPU_BLAS_THREADS");
}

// Read when the emulated GPU is created, not at the first stall (a bad value was ignored until then).
TEST(Env, MalformedEmuStallThrowsFromDeviceCreation) {
    ::setenv("SCMOE_EMU_STALL_S", "-1", 1);
    const std::string e = error_of([] { make_device("emu"); });
    EXPECT_NE(e.find("SCMOE_EMU_STALL_S='-1': expected a number of seconds > 0"), std::string::npos) << e;
    ::unsetenv("SCMOE_EMU_STALL_S");
    EXPECT_NO_THROW(make_device("emu"));
}

TEST(Env, IntegerAndSecondsReaders) {
    ::unsetenv("SCMOE_TEST_ENV_VALUE");
    EXPECT_FALSE(env_integer("SCMOE_TEST_ENV_VALUE", 1, 8, "things").has_value());
    ::setenv("SCMOE_TEST_ENV_VALUE", "", 1);
    EXPECT_FALSE(env_integer("SCMOE_TEST_ENV_VALUE", 1, 8, "things").has_value());
    ::setenv("SCMOE_TEST_ENV_VALUE", "8", 1);
    EXPECT_EQ(env_integer("SCMOE_TEST_ENV_VALUE", 1, 8, "things"), 8);
    for (const char* bad : {"9", "0", "-1", "4x", "x4", " ", "1e3", "99999999999999999999999"}) {
        ::setenv("SCMOE_TEST_ENV_VALUE", bad, 1);
        const std::string e = error_of([] { env_integer("SCMOE_TEST_ENV_VALUE", 1, 8, "things"); });
        EXPECT_NE(e.find(std::string("SCMOE_TEST_ENV_VALUE='") + bad + "': expected an integer from 1 to 8 (things)"),
                  std::string::npos)
            << e;
    }
    ::setenv("SCMOE_TEST_ENV_VALUE", "0.5", 1);
    EXPECT_EQ(env_seconds("SCMOE_TEST_ENV_VALUE"), 0.5);
    for (const char* bad : {"0", "-3", "5s", "inf", "nan", "abc"}) {
        ::setenv("SCMOE_TEST_ENV_VALUE", bad, 1);
        const std::string e = error_of([] { env_seconds("SCMOE_TEST_ENV_VALUE"); });
        EXPECT_NE(e.find(std::string("SCMOE_TEST_ENV_VALUE='") + bad + "': expected a number of seconds > 0"),
                  std::string::npos)
            << e;
    }
    ::unsetenv("SCMOE_TEST_ENV_VALUE");
}

}  // namespace
}  // namespace scmoe
