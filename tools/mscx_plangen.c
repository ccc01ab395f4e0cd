/* SPDX-License-Identifier: MIT */
/* placeholder, filled in by its owner */
int main(void)
{
    return 0;
}
