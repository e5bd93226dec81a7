#!/usr/bin/env bash
# usage: expect_error.sh [--one-rank] REGEX -- COMMAND...
#
# Passes when COMMAND (ddp_train under mpirun) fails the way a user should see it:
# - it exits non-zero, within 60 s (a hang fails), and its output matches REGEX;
# - one line of standard error tells what failed, and the job is gone within 10 s
#   of that line:
#   default (an error every rank finds together, e.g. a bad input file): exactly
#     one line starting with "error:", and no sign of MPI_Abort (its banner):
#     the ranks leave through MPI_Finalize;
#   --one-rank (a failure one rank sees alone): exactly one line
#     "rank N (host): what failed: message", after which MPI_Abort ends the job;
# - no stack dump: no "terminate called", no "*** Process received signal ***",
#   no backtrace frames, no rank killed by a signal.
set -u
mode=collective
if [ "$1" = --one-rank ]; then
  mode=one_rank
  shift
fi
regex=$1
shift 2

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Standard output to a file; each standard error line with the time it arrived, to
# time the job's end from the error line. The error lines are counted in standard
# error alone: mpirun forwards a rank's two streams separately, in chunks of a few
# KB, so a line on stderr can land inside a long stdout write (the resolved input)
# when both go to one pipe.
(
  timeout 60 "$@" 2>&1 >"$tmp/stdout"
  echo "$? $EPOCHREALTIME" >"$tmp/end"
) | while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$tmp/stamped"
rc=255 end=$EPOCHREALTIME
[ -s "$tmp/end" ] && read -r rc end <"$tmp/end"
err=$(cut -d' ' -f2- "$tmp/stamped")
out=$(cat "$tmp/stdout")$'\n'$err
echo "--- standard output"
cat "$tmp/stdout"
echo "--- standard error"
printf '%s\n' "$err"
echo "--- exit status $rc"

fail() {
  echo "FAIL: $*"
  exit 1
}
[ "$rc" -eq 124 ] && fail "timed out after 60 s (a hang)"
[ "$rc" -eq 0 ] && fail "exited 0"
grep -Eq -- "$regex" <<<"$out" || fail "output does not match /$regex/"

if [ $mode = collective ]; then
  line_re='error:'
  # Open MPI's abort banner, or what is left of it when the aborting rank dies before
  # mpirun has it (ORTE_ERROR_LOG from show_help.c); MPICH's line.
  grep -Eq 'MPI_ABORT was invoked|ORTE_ERROR_LOG|called MPI_Abort' <<<"$out" &&
    fail "MPI_Abort for an error every rank found: expected MPI_Finalize"
  n=$(grep -Ec "^$line_re" <<<"$err")
  [ "$n" -ne 1 ] && fail "$n lines of standard error start with 'error:', expected 1"
else
  line_re='rank [0-9]+ \([^)]*\): [^ ].*: '
  n=$(grep -Ec "^$line_re" <<<"$err")
  [ "$n" -ne 1 ] && fail "$n lines of standard error look like 'rank N (host): what failed: message', expected 1"
  n=$(grep -c '^error:' <<<"$out")
  [ "$n" -ne 0 ] && fail "$n lines start with 'error:', expected none"
fi

grep -q 'terminate called' <<<"$out" && fail "'terminate called': an exception escaped the fatal path"
grep -q 'Process received signal' <<<"$out" && fail "a rank crashed on a signal (stack dump)"
grep -Eq '\[ *[0-9]+\] .*\[0x[0-9a-f]+\]|\(\+0x[0-9a-f]+\)|^Backtrace|Traceback' <<<"$out" &&
  fail "a backtrace in the output"
grep -Eq 'exited on signal|killed by signal' <<<"$out" && fail "a rank was killed by a signal"

t_line=$(grep -E -m1 "^[0-9.]+ ($line_re)" "$tmp/stamped" | cut -d' ' -f1)
after=$(awk -v a="$t_line" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo "--- the job ended $after s after the error line"
awk -v s="$after" 'BEGIN { exit !(s > 10) }' && fail "the job took $after s (> 10 s) to end after the error line"
echo "PASS"
