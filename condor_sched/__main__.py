from condor_sched.cli import main

main()
