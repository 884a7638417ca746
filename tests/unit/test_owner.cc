// A temporary's owner is alive only as the very process that wrote it: same boot, same pid, same start
// time. A reused pid, another boot, a reaped process and a name without an owner tag all read as not it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "loaders/owner.h"

using namespace nibble;

TEST(Owner, ThisProcessIsAlive) {
  const Owner& me = current_owner();
  EXPECT_EQ(me.pid, long(::getpid()));
  EXPECT_EQ(me.boot_id.size(), 32u);
  EXPECT_GT(me.start_time, 0u);
  EXPECT_TRUE(owner_alive(me));
}

TEST(Owner, TagRoundTrips) {
  Owner o;
  ASSERT_TRUE(parse_owner_tag(owner_tag(current_owner()), &o));
  EXPECT_EQ(o.pid, current_owner().pid);
  EXPECT_EQ(o.boot_id, current_owner().boot_id);
  EXPECT_EQ(o.start_time, current_owner().start_time);
  for (const char* bad : {"12345", "", "-", "1--2", "x-ab-3", "1-zz-3", "1-ab-", "0-ab-3", "1-ab-3x"})
    EXPECT_FALSE(parse_owner_tag(bad, &o)) << bad;
}

TEST(Owner, ReusedPidOrOtherBootIsNotTheOwner) {
  Owner o = current_owner();
  o.start_time += 1;  // the same pid, started at another time: another process
  EXPECT_FALSE(owner_alive(o));
  o = current_owner();
  o.boot_id = std::string(32, '0');  // the same pid and start time, but before a reboot
  EXPECT_FALSE(owner_alive(o));
  o = current_owner();
  o.pid = 0x3ffffff0;  // over any pid_max: no such process
  EXPECT_FALSE(owner_alive(o));
}

TEST(Owner, ReapedChildIsDead) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  Owner o;
  o.pid = child;
  o.boot_id = boot_id();
  o.start_time = process_start_time(child);
  EXPECT_GT(o.start_time, 0u);
  EXPECT_TRUE(owner_alive(o));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(owner_alive(o));
}

// The command name in /proc/<pid>/stat is in parentheses and may itself hold ") " and spaces.
TEST(Owner, StartTimeOfAProcessWithAnAwkwardName) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::prctl(PR_SET_NAME, "a) b ( c", 0, 0, 0);
    ::pause();
    ::_exit(0);
  }
  const uint64_t before = process_start_time(child);
  std::string comm;
  for (int i = 0; i < 2000 && comm != "a) b ( c"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::ifstream f("/proc/" + std::to_string(child) + "/comm");
    std::getline(f, comm);
  }
  EXPECT_EQ(comm, "a) b ( c");
  EXPECT_EQ(process_start_time(child), before);
  EXPECT_GT(before, 0u);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}
