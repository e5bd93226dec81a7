// What the launcher's environment says, and the start-up line where MPI made each of
// its tasks a job of one rank (comm/context.hpp). The run itself under srun without
// PMI: slurm_separate_jobs.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "comm/context.hpp"

namespace {

using ddp::Launch;

std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* name) {
  const auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
Launch launch(std::map<std::string, std::string> env) {
  g_env = std::move(env);
  return ddp::launch_from_environment(fake_getenv);
}

TEST(Launch, TakesTheMpiLaunchersWordOverSlurms) {
  // Open MPI's mpirun inside a Slurm step (its daemons started by srun on 2 nodes):
  // the step's count is the daemons', not the ranks'.
  Launch l = launch({{"SLURM_STEP_NUM_TASKS", "2"},
                     {"SLURM_PROCID", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "1"},
                     {"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_EQ(l.tasks, 1);
  EXPECT_EQ(l.task, 0);
  EXPECT_EQ(l.variable, "OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(ddp::separate_jobs_problem(l, 1), "");
  l = launch({{"PMI_SIZE", "4"}, {"PMI_RANK", "3"}, {"SLURM_STEP_NUM_TASKS", "4"}});
  EXPECT_EQ(l.variable, "PMI_SIZE");
  EXPECT_EQ(l.task, 3);
  l = launch({{"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}});
  EXPECT_EQ(l.tasks, 8);
  EXPECT_EQ(l.task, 5);
  EXPECT_EQ(l.launcher, "srun");
  // A batch script's own shell, or no launcher: nothing said.
  EXPECT_EQ(launch({{"SLURM_NTASKS", "16"}, {"SLURM_PROCID", "0"}}).tasks, 0);
  EXPECT_EQ(launch({}).tasks, 0);
}

TEST(Launch, SeparateJobsAreOneLine) {
  const Launch srun = launch({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}});
  EXPECT_EQ(
      ddp::separate_jobs_problem(srun, 1),
      "srun started 2 tasks (SLURM_STEP_NUM_TASKS=2), but MPI made each of them a job of 1 rank, so each "
      "would train a run of its own: srun did not give MPI the ranks: Open MPI needs srun --mpi=pmix (or "
      "export SLURM_MPI_TYPE=pmix), MPICH and Intel MPI --mpi=pmi2; `srun --mpi=list` shows what this "
      "Slurm has. Or start ddp_train with the mpirun of the MPI it was built with");
  EXPECT_EQ(ddp::separate_jobs_problem(srun, 2), "") << "MPI has the ranks";
  EXPECT_EQ(ddp::separate_jobs_problem(launch({{"SLURM_STEP_NUM_TASKS", "1"}}), 1), "") << "one task";
  const Launch mpich = launch({{"PMI_SIZE", "3"}, {"PMI_RANK", "0"}});
  EXPECT_EQ(
      ddp::separate_jobs_problem(mpich, 1),
      "an MPICH-style launcher (MPICH's or Intel MPI's mpiexec, srun --mpi=pmi2) started 3 tasks "
      "(PMI_SIZE=3), but MPI made each of them a job of 1 rank, so each would train a run of its own: "
      "ddp_train was built with another MPI than that launcher's: start it with the mpirun of the MPI it "
      "was built with (ddp_train --version names it), or with srun");
}

}  // namespace
