// Launch-environment parsing: each launcher's variables, the defaults, and every malformed
// or inconsistent variable (the error must name the variable and its value).
#include "zero/comm/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zero/comm/communicator.h"

namespace zinf::zero {
namespace {

using Vars = std::map<std::string, std::string>;

LaunchEnv detect(const Vars& vars) {
  return detect_launch_env([&vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) {
      return std::nullopt;
    }
    return it->second;
  });
}

// The message of the CommError that detect() throws for `vars`; fails the test if none.
std::string error_of(const Vars& vars) {
  try {
    const LaunchEnv env = detect(vars);
    ADD_FAILURE() << "no error; got " << to_string(env);
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "launch environment");
    EXPECT_EQ(e.rank(), -1);
    return e.what();
  }
  return {};
}

Vars torchrun_vars() {
  return {{"RANK", "3"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RUN_ID", "none"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

TEST(LaunchEnv, NothingSetIsASingleProcess) {
  const LaunchEnv env = detect({});
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.launcher, "none");
  EXPECT_TRUE(env.master_addr.empty());
  EXPECT_FALSE(env.agent_store);
}

TEST(LaunchEnv, TorchrunWithAgentStore) {
  const LaunchEnv env = detect(torchrun_vars());
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.store_prefix, "/worker/attempt_2");
}

TEST(LaunchEnv, TorchrunStandaloneServesItsOwnStore) {
  Vars vars = torchrun_vars();
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  const LaunchEnv env = detect(vars);
  EXPECT_FALSE(env.agent_store);
  EXPECT_TRUE(env.store_prefix.empty());
}

TEST(LaunchEnv, PlainEnvDefaultsToOneNode) {
  const LaunchEnv env = detect({{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(env.launcher, "env");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_FALSE(env.agent_store);
}

TEST(LaunchEnv, WorldOfOneNeedsNoPort) {
  const LaunchEnv env = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.master_port, 0);
}

TEST(LaunchEnv, OpenMpi) {
  const LaunchEnv env = detect({{"OMPI_COMM_WORLD_RANK", "5"},
                                {"OMPI_COMM_WORLD_SIZE", "8"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                {"MASTER_ADDR", "node0"},
                                {"MASTER_PORT", "4000"}});
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 4000);
}

TEST(LaunchEnv, OpenMpiOnOneNodeDefaultsToLoopback) {
  const LaunchEnv env = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"MASTER_PORT", "4000"}});
  EXPECT_EQ(env.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, SlurmReadsThisNodesTaskCount) {
  const LaunchEnv env = detect({{"SLURM_PROCID", "6"},
                                {"SLURM_NTASKS", "7"},
                                {"SLURM_LOCALID", "0"},
                                {"SLURM_NODEID", "3"},
                                {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                                {"MASTER_ADDR", "n0"},
                                {"MASTER_PORT", "29400"}});
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 6);
  EXPECT_EQ(env.world_size, 7);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "n0");
}

TEST(LaunchEnv, SlurmPrefersTheStepValues) {
  const LaunchEnv env = detect({{"SLURM_PROCID", "1"},
                                {"SLURM_NTASKS", "16"},
                                {"SLURM_STEP_NUM_TASKS", "2"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NODEID", "0"},
                                {"SLURM_TASKS_PER_NODE", "16"},
                                {"SLURM_STEP_TASKS_PER_NODE", "2"},
                                {"MASTER_PORT", "29400"}});
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, TorchrunWinsOverSlurmAndOpenMpi) {
  Vars vars = torchrun_vars();
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_NTASKS"] = "1";
  vars["OMPI_COMM_WORLD_RANK"] = "0";
  vars["OMPI_COMM_WORLD_SIZE"] = "1";
  EXPECT_EQ(detect(vars).launcher, "torchrun");
}

TEST(LaunchEnv, ToStringNamesTheStore) {
  const std::string text = to_string(detect(torchrun_vars()));
  EXPECT_NE(text.find("rank 3 of 4"), std::string::npos) << text;
  EXPECT_NE(text.find("10.1.2.3:29500"), std::string::npos) << text;
  EXPECT_NE(text.find("/worker/attempt_2"), std::string::npos) << text;
}

// Each bad variable: the message must name it and show its value.
struct BadCase {
  const char* what;
  Vars vars;
  std::vector<std::string> expected;  // substrings of the message
};

class LaunchEnvError : public ::testing::TestWithParam<BadCase> {};

TEST_P(LaunchEnvError, NamesTheVariable) {
  const std::string message = error_of(GetParam().vars);
  for (const std::string& part : GetParam().expected) {
    EXPECT_NE(message.find(part), std::string::npos)
        << GetParam().what << ": \"" << part << "\" not in: " << message;
  }
}

Vars with(Vars base, const std::string& name, const std::optional<std::string>& value) {
  if (value) {
    base[name] = *value;
  } else {
    base.erase(name);
  }
  return base;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LaunchEnvError,
    ::testing::Values(
        BadCase{
            "rank without world size", {{"RANK", "0"}}, {"WORLD_SIZE is not set", "RANK=\"0\""}},
        BadCase{
            "world size without rank", {{"WORLD_SIZE", "2"}}, {"RANK is not", "WORLD_SIZE=\"2\""}},
        BadCase{"rank not numeric",
                with(torchrun_vars(), "RANK", "one"),
                {"RANK=\"one\"", "not a decimal"}},
        BadCase{"negative rank", with(torchrun_vars(), "RANK", "-1"), {"RANK=\"-1\""}},
        BadCase{"rank with blanks", with(torchrun_vars(), "RANK", " 1"), {"RANK=\" 1\""}},
        BadCase{"empty rank", with(torchrun_vars(), "RANK", ""), {"RANK is set but empty"}},
        BadCase{"rank >= world size",
                with(torchrun_vars(), "RANK", "4"),
                {"RANK=\"4\"", "WORLD_SIZE=\"4\""}},
        BadCase{"world size zero", with(torchrun_vars(), "WORLD_SIZE", "0"), {"WORLD_SIZE=\"0\""}},
        BadCase{"world size overflow",
                with(torchrun_vars(), "WORLD_SIZE", "99999999999"),
                {"WORLD_SIZE=\"99999999999\""}},
        BadCase{"local rank >= local world",
                with(torchrun_vars(), "LOCAL_RANK", "2"),
                {"LOCAL_RANK=\"2\"", "local world size 2"}},
        BadCase{"local world > world",
                with(torchrun_vars(), "LOCAL_WORLD_SIZE", "5"),
                {"LOCAL_WORLD_SIZE=\"5\"", "WORLD_SIZE=\"4\""}},
        BadCase{"port missing",
                with(torchrun_vars(), "MASTER_PORT", std::nullopt),
                {"MASTER_PORT is not set"}},
        BadCase{"port not numeric",
                with(torchrun_vars(), "MASTER_PORT", "http"),
                {"MASTER_PORT=\"http\""}},
        BadCase{"port out of range",
                with(torchrun_vars(), "MASTER_PORT", "70000"),
                {"MASTER_PORT=\"70000\"", "65535"}},
        BadCase{"address missing across nodes",
                with(torchrun_vars(), "MASTER_ADDR", std::nullopt),
                {"MASTER_ADDR is not set"}},
        BadCase{"address empty",
                with(torchrun_vars(), "MASTER_ADDR", ""),
                {"MASTER_ADDR is set but empty"}},
        BadCase{"agent store flag",
                with(torchrun_vars(), "TORCHELASTIC_USE_AGENT_STORE", "maybe"),
                {"TORCHELASTIC_USE_AGENT_STORE=\"maybe\""}},
        BadCase{"agent store without attempt",
                with(torchrun_vars(), "TORCHELASTIC_RESTART_COUNT", std::nullopt),
                {"TORCHELASTIC_RESTART_COUNT is not set"}},
        BadCase{"mpi rank without size",
                {{"OMPI_COMM_WORLD_RANK", "0"}},
                {"OMPI_COMM_WORLD_SIZE is not set"}},
        BadCase{"mpi local size bad",
                {{"OMPI_COMM_WORLD_RANK", "0"},
                 {"OMPI_COMM_WORLD_SIZE", "2"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "x"},
                 {"MASTER_PORT", "1"}},
                {"OMPI_COMM_WORLD_LOCAL_SIZE=\"x\""}},
        BadCase{"slurm without task count",
                {{"SLURM_PROCID", "0"}},
                {"SLURM_PROCID=\"0\"", "SLURM_NTASKS"}},
        BadCase{"slurm rank >= tasks",
                {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}},
                {"SLURM_PROCID=\"2\"", "SLURM_NTASKS=\"2\""}},
        BadCase{"slurm bad task list",
                {{"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_NODEID", "0"},
                 {"SLURM_TASKS_PER_NODE", "2(x"},
                 {"MASTER_PORT", "1"}},
                {"SLURM_TASKS_PER_NODE=\"2(x\""}},
        BadCase{"slurm node outside task list",
                {{"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_NODEID", "2"},
                 {"SLURM_TASKS_PER_NODE", "1(x2)"},
                 {"MASTER_PORT", "1"}},
                {"SLURM_NODEID=\"2\"", "SLURM_TASKS_PER_NODE=\"1(x2)\""}},
        BadCase{"slurm local id >= node tasks",
                {{"SLURM_PROCID", "1"},
                 {"SLURM_NTASKS", "4"},
                 {"SLURM_LOCALID", "1"},
                 {"SLURM_NODEID", "0"},
                 {"SLURM_TASKS_PER_NODE", "1,3"},
                 {"MASTER_ADDR", "a"},
                 {"MASTER_PORT", "1"}},
                {"SLURM_LOCALID=\"1\"", "SLURM_TASKS_PER_NODE=\"1,3\""}}));

}  // namespace
}  // namespace zinf::zero
