from dflash_doctor.children import drop_working_folder_from_path

drop_working_folder_from_path()

from dflash_doctor.cli import main  # noqa: E402 - the path is cleaned before anything else is imported

main()
