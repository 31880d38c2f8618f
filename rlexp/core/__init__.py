"""What every component may use and that uses no component: routing over actor replicas (`services`),
seeds (`seeding`), tensor files (`weights`), a user's plug-ins (`plugins`),
run-folder writes that never follow a link (`runfolder`)."""
